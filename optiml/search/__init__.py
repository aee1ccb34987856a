"""OptiML-X: the search for faster variants of a kernel. `mcts` is the generic tree search (no
CUDA in it); `tree_io` is the file a search is saved to and resumed from.
"""

from optiml.search.mcts import (
    Evaluation,
    Node,
    Problem,
    Progress,
    Search,
    SearchConfig,
    SearchResult,
    StopReason,
)
from optiml.search.tree_io import Codec

__all__ = [
    "Codec",
    "Evaluation",
    "Node",
    "Problem",
    "Progress",
    "Search",
    "SearchConfig",
    "SearchResult",
    "StopReason",
]
