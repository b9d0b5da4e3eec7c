"""The languages the SandboxFusion-compatible server runs: each one's image, the file its
code goes to and the commands that compile and run it.

The defaults follow SandboxFusion's runners (``sandbox/runners/major.py``): the code is a
file in the request's directory beside its ``files``, ``python`` runs it with the
interpreter, ``bash`` with ``/bin/bash``, ``cpp`` compiles it with ``g++ -std=c++17`` and
then runs the binary, ``pytest`` runs pytest on it with the request's ``args``.  Every
default runs in ``localhost/flowmesh/code-runner:bookworm`` (swe-base plus Debian's g++:
``python -m flowmesh_sdk.imagebuild code-runner``); give any other image per language with
:func:`with_images` (``flowmesh serve sandbox-fusion --image cpp=gcc:14``).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, replace

from ...errors import SpecError
from ...imagebuild.build import CODE_RUNNER_IMAGE
from ...registry.reference import ImageRef

__all__ = ["DEFAULT_LANGUAGES", "WORKDIR", "LanguageSpec", "parse_image_overrides", "with_images"]

#: the request's directory: its files, its code, the working directory of its commands
WORKDIR = "/work"
_STEM = "_flowmesh_code"


@dataclass(frozen=True, slots=True)
class LanguageSpec:
    """How one ``language`` runs: ``source`` (a file name in :data:`WORKDIR`) holds the code;
    ``compile`` (None: interpreted) and then ``run`` are shell commands run there, with
    ``{args}`` replaced by the request's ``args``, shell-quoted."""

    name: str
    image: str
    source: str
    run: str
    compile: str | None = None

    def __post_init__(self) -> None:
        where = f"languages.{self.name}"
        for fname in ("name", "image", "source", "run"):
            if not isinstance(getattr(self, fname), str) or not getattr(self, fname):
                raise SpecError(f"{where}.{fname}", f"must be a non-empty string, got {getattr(self, fname)!r}")
        if "/" in self.source or self.source in (".", ".."):
            raise SpecError(f"{where}.source", f"must be a file name (no '/'), got {self.source!r}")
        if self.compile is not None and (not isinstance(self.compile, str) or not self.compile):
            raise SpecError(f"{where}.compile", f"must be a shell command or None, got {self.compile!r}")
        try:
            ImageRef.parse(self.image)
        except SpecError as exc:
            raise SpecError(f"{where}.image", str(exc).removeprefix("image: ")) from None

    def command(self, template: str, args: tuple[str, ...]) -> str:
        return template.replace("{args}", " ".join(shlex.quote(a) for a in args))


DEFAULT_LANGUAGES: Mapping[str, LanguageSpec] = {
    "python": LanguageSpec("python", CODE_RUNNER_IMAGE, f"{_STEM}.py", f"python3 {_STEM}.py"),
    "bash": LanguageSpec("bash", CODE_RUNNER_IMAGE, f"{_STEM}.sh", f"/bin/bash {_STEM}.sh"),
    "cpp": LanguageSpec("cpp", CODE_RUNNER_IMAGE, f"{_STEM}.cpp", "./_flowmesh_bin",
                        compile=f"g++ -std=c++17 {_STEM}.cpp -o _flowmesh_bin -lpthread"),
    "pytest": LanguageSpec("pytest", CODE_RUNNER_IMAGE, f"{_STEM}_test.py",
                           f"python3 -m pytest -q -p no:cacheprovider {_STEM}_test.py {{args}}"),
}


def with_images(languages: Mapping[str, LanguageSpec], images: Mapping[str, str]) -> dict[str, LanguageSpec]:
    """``languages`` with the image of each language named in ``images`` replaced."""
    out = dict(languages)
    for name, image in images.items():
        if name not in out:
            raise SpecError("languages", f"no language {name!r} to give an image to; "
                                         f"known: {', '.join(sorted(out))}")
        out[name] = replace(out[name], image=image)
    return out


def parse_image_overrides(items: list[str]) -> dict[str, str]:
    """``["cpp=gcc:14", ...]`` (the CLI's ``--image LANG=IMAGE``) as a mapping."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, image = item.partition("=")
        if not sep or not name or not image:
            raise SpecError("--image", f"must be LANG=IMAGE (e.g. cpp=localhost/flowmesh/code-runner:bookworm), "
                                       f"got {item!r}")
        out[name.strip()] = image.strip()
    return out
