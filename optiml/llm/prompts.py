"""Prompts as versioned template files in `optiml/llm/prompts/`, rendered with `string.Template`.

A file starts with `key: value` header lines (`version` required, `variables` listing every
placeholder), then `== system ==` and `== user ==` sections; no section marker means user only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from string import Template

from optiml.llm.messages import Message

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_HEADER = re.compile(r"^([a-z_]+):\s*(.*?)\s*$")
_SECTION = re.compile(r"^== (system|user) ==\s*$")


class PromptError(ValueError):
    """A prompt that does not exist, a malformed template, or wrong variables to render it."""


@dataclass(frozen=True)
class RenderedPrompt:
    name: str
    version: str
    system: str | None
    user: str

    @property
    def id(self) -> str:
        """`name@version`, which callers pass as `prompt_id` so it joins the cache key."""
        return f"{self.name}@{self.version}"

    @property
    def text(self) -> str:
        return f"{self.system}\n\n{self.user}" if self.system else self.user

    def messages(self) -> list[Message]:
        system = [Message(role="system", content=self.system)] if self.system else []
        return [*system, Message(role="user", content=self.user)]


@dataclass(frozen=True)
class PromptTemplate:
    name: str
    version: str
    description: str
    variables: tuple[str, ...]
    system: Template | None
    user: Template

    def render(self, **values: object) -> RenderedPrompt:
        missing = sorted(set(self.variables) - set(values))
        unknown = sorted(set(values) - set(self.variables))
        problems = [f"missing {', '.join(missing)}"] if missing else []
        problems += [f"unknown {', '.join(unknown)}"] if unknown else []
        if problems:
            raise PromptError(f"prompt {self.name}: {'; '.join(problems)}")
        # Values are inserted verbatim and never re-scanned, so code full of `$` is safe.
        text = {name: str(value) for name, value in values.items()}
        return RenderedPrompt(
            name=self.name,
            version=self.version,
            system=self.system.substitute(text) if self.system else None,
            user=self.user.substitute(text),
        )


def load_prompt(name: str, **values: object) -> RenderedPrompt:
    """The prompt `name` rendered with `values`, which must be exactly its variables."""
    return prompt_template(name).render(**values)


def prompt_names() -> list[str]:
    return sorted(
        entry.name.removesuffix(".md")
        for entry in resources.files("optiml.llm").joinpath("prompts").iterdir()
        if entry.name.endswith(".md")
    )


@cache
def prompt_template(name: str) -> PromptTemplate:
    if not _NAME.match(name):
        raise PromptError(f"{name!r} is not a prompt name")
    source = resources.files("optiml.llm").joinpath("prompts").joinpath(f"{name}.md")
    if not source.is_file():
        raise PromptError(f"no prompt named {name} (known: {', '.join(prompt_names())})")
    return parse_template(name, source.read_text(encoding="utf-8"))


def parse_template(name: str, text: str) -> PromptTemplate:
    lines = text.splitlines()
    if not lines or not re.match(r"^version:\s*\S", lines[0]):
        raise PromptError(f"prompt {name}: the first line must be `version: N`")
    # The header runs to the first blank line or section marker.
    header: dict[str, str] = {}
    while lines and lines[0].strip() and not _SECTION.match(lines[0]):
        match = _HEADER.match(lines.pop(0))
        if match is None:
            raise PromptError(f"prompt {name}: header lines are `key: value`")
        header[match.group(1)] = match.group(2)
    sections: dict[str, list[str]] = {}
    if not any(_SECTION.match(line) for line in lines):
        sections["user"] = lines
    else:
        current: list[str] | None = None
        for line in lines:
            if marker := _SECTION.match(line):
                if marker.group(1) in sections:
                    raise PromptError(f"prompt {name}: section {marker.group(1)} appears twice")
                current = sections[marker.group(1)] = []
            elif current is not None:
                current.append(line)
            elif line.strip():
                raise PromptError(f"prompt {name}: text before the first `== section ==` marker")
    bodies = {key: "\n".join(body).strip() for key, body in sections.items()}
    if not bodies.get("user"):
        raise PromptError(f"prompt {name}: the user section is empty")
    templates = {key: Template(body) for key, body in bodies.items() if body}
    declared = tuple(v.strip() for v in header.get("variables", "").split(",") if v.strip())
    used: set[str] = set()
    for template in templates.values():
        if not template.is_valid():
            raise PromptError(f"prompt {name}: a `$` is neither `$$` nor `$name`")
        used.update(template.get_identifiers())
    if used != set(declared):
        raise PromptError(
            f"prompt {name}: `variables` lists {sorted(declared)} but the text uses {sorted(used)}"
        )
    return PromptTemplate(
        name=name,
        version=header["version"],
        description=header.get("description", ""),
        variables=declared,
        system=templates.get("system"),
        user=templates["user"],
    )
