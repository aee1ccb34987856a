"""The compile job, run as `python -m server.check_job` so that a stale one dies with its nvcc: it
reads {"text", "path", "arch"} as JSON on stdin, checks the text as if it were the file at `path`
(nothing is written there) and writes the outcome (`optiml.api.CheckFeedback`) as JSON on stdout."""

from __future__ import annotations

import json
import sys

from optiml.api import check_text


def main() -> int:
    request = json.load(sys.stdin)
    feedback = check_text(request["text"], request["path"], request["arch"])
    sys.stdout.write(feedback.model_dump_json())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
