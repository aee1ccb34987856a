"""The compile job, run as `python -m server.check_job` so that a stale one dies with its nvcc: it
reads {"text", "path", "arch", "build"} as JSON on stdin, checks the text as if it were the file at
`path` (nothing is written there), built with the project's options (`build`), and writes the
outcome (`optiml.api.CheckFeedback`) as JSON on stdout."""

from __future__ import annotations

import json
import sys

from optiml.api import BuildOptions, check_text, set_build


def main() -> int:
    request = json.load(sys.stdin)
    if request.get("build"):
        set_build(request["path"], BuildOptions.model_validate(request["build"]), database=None)
    feedback = check_text(request["text"], request["path"], request["arch"])
    sys.stdout.write(feedback.model_dump_json())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
