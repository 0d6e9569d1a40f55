"""The planner: a cost model from chip figures (measured efficiency matrices, else catalog profiles
and stated defaults), an event-driven step simulator, and a search over layouts of a model on a
mixed cluster; `hal plan` and `hal simulate` drive it (docs/planner.md)."""
from .cost import ModelFacts
from .facts import ChipFacts, chip_facts
from .plan_search import PlanSearchError, SearchResult, search
from .simulate import Layout, SimResult, simulate

__all__ = ["ModelFacts", "ChipFacts", "chip_facts", "search", "SearchResult", "PlanSearchError", "simulate",
           "Layout", "SimResult"]
