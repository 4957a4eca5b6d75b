"""Figures for the notebooks: one look (``style``), one function per figure kind."""

from .feasibility import plot_feasibility_map, plot_strip
from .pareto import ParetoCurves, pareto_curves, plot_pareto
from .style import (POLICY_STYLES, STATUS_COLORS, panel_grid, policy_style, save_figure, short_trace_name,
                    trace_titles, use_style)
