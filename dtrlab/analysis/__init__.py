"""Analyses of simulated runs: plain functions returning result records."""

from .divergence import Divergence, divergence, identical_evictions
from .events import RecordedRun, Recorder, record
from .interventions import InterventionSearch, single_tensor_search
from .inclusion import InclusionResult, inclusion
from .variant_census import VariantCensus, variant_census
