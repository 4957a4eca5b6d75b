"""Figures for the notebooks: one look (``style``), one function per figure kind."""

from .census import plot_hole_census, plot_variant_census
from .feasibility import plot_feasibility_map, plot_strip
from .inclusion import plot_inclusion, plot_inclusion_census
from .pareto import ParetoCurves, pareto_curves, plot_overhead, plot_pareto
from .style import (POLICY_STYLES, STATUS_COLORS, figure_directory, panel_grid, policy_style, policy_styles,
                    save_figure, short_trace_name, trace_set_name, trace_titles, use_style)
from .timelines import memory_timelines
