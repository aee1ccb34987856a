"""The LLM policy of OptiML-X and the LLM judge's review, on the LLM layer `optiml.llm`, one module
per job:

- `answers.py`: what the model answers (structured output: edits, the judge's review);
- `diff.py`: the code in an answer read (a fence taken off, a unified diff applied strictly);
- `checks.py`: the checks an edit passes before it becomes a candidate (apply, parse, signature,
  spec, flags, unchanged, compile), each failure an `EditRejected` naming its stage;
- `prompting.py`: what the model is shown (the kernel, its profile, the edits on the way to it,
  the catalog's hints);
- `record.py`: answers kept by what they were about, so a recorded run replays on another run's
  measurements;
- `policy.py`: `LLMPolicy`, the search's policy (edits pooled per variant, a provider's failure
  recorded, never the end of the search);
- `review.py`: the LLM judge's review of a confirmed candidate;
- `factory.py`: both made from an `OptimizeRequest` and the LLM settings.
"""

from optiml.search.llm_policy.answers import EditProposals, JudgeReview, ProposedEdit
from optiml.search.llm_policy.checks import (
    EditRejected,
    PreparedEdit,
    check_edit,
    compile_edit,
    merge_flags,
    prepare_edit,
)
from optiml.search.llm_policy.diff import DiffError, apply_unified_diff, strip_fence
from optiml.search.llm_policy.factory import llm_settings, make_llm_policy
from optiml.search.llm_policy.policy import LLMPolicy
from optiml.search.llm_policy.prompting import kernel_region
from optiml.search.llm_policy.record import AnswerLog, structured_with_record
from optiml.search.llm_policy.review import make_llm_review

__all__ = [
    "AnswerLog",
    "DiffError",
    "EditProposals",
    "EditRejected",
    "JudgeReview",
    "LLMPolicy",
    "PreparedEdit",
    "ProposedEdit",
    "apply_unified_diff",
    "check_edit",
    "compile_edit",
    "kernel_region",
    "llm_settings",
    "make_llm_policy",
    "make_llm_review",
    "merge_flags",
    "prepare_edit",
    "strip_fence",
    "structured_with_record",
]
