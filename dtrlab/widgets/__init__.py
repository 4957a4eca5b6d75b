"""Interactive widgets for notebooks (ipywidgets)."""

from .explorer import BudgetExplorer

__all__ = ["BudgetExplorer"]
