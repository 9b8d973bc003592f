"""The built-in code-interpreter template's recipe (templates/code_interpreter.py): a valid
E2B build request, reproducible, and renamed by any change of what goes in."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from aenv.templates import code_interpreter
from aenv.templates.e2b_steps import plan_from_e2b


def _package(root: Path, body: str) -> Path:
    package = root / "interpreter"
    (package / "__pycache__").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "app.py").write_text(body)
    (package / "__pycache__" / "app.cpython-311.pyc").write_bytes(b"\0")
    return package


def test_the_recipe_is_a_valid_build_request() -> None:
    recipe = code_interpreter.recipe(inputs_hash="a" * 64, package_hash="b" * 64)
    plan = plan_from_e2b(from_image=None, from_template="base", registry=None,
                         steps=recipe.steps, start_cmd=recipe.start_cmd,
                         ready_cmd=recipe.ready_cmd, force=False)
    steps = plan.stages[0].steps
    assert [step.kind for step in steps] == ["USER", "COPY", "RUN", "COPY", "USER", "WORKDIR"]
    assert (steps[1].files_hash, steps[3].files_hash) == ("a" * 64, "b" * 64)
    assert plan.start_cmd is not None and "--port 49999" in plan.start_cmd
    # The install needs no network: only the wheels the node brought.
    assert "--no-index" in steps[2].args[0]


def test_the_package_context_holds_the_package_and_nothing_compiled(tmp_path: Path) -> None:
    package = code_interpreter.package_tar(_package(tmp_path, "x = 1\n"))
    with tarfile.open(fileobj=io.BytesIO(package)) as tar:
        names = sorted(tar.getnames())
        assert {m.mtime for m in tar.getmembers()} == {0}
    assert names == ["aenv/__init__.py", "aenv/interpreter/__init__.py", "aenv/interpreter/app.py"]


def test_same_inputs_same_bytes_any_change_another_tag(tmp_path: Path) -> None:
    one = code_interpreter.package_tar(_package(tmp_path / "a", "x = 1\n"))
    same = code_interpreter.package_tar(_package(tmp_path / "b", "x = 1\n"))
    other = code_interpreter.package_tar(_package(tmp_path / "c", "x = 2\n"))
    assert one == same and other != one
    tags = {code_interpreter.recipe(inputs_hash="a" * 64, package_hash=h).tag
            for h in ("b" * 64, "c" * 64)}
    assert len(tags) == 2


def test_the_inputs_context_is_reproducible(tmp_path: Path) -> None:
    wheels = [tmp_path / "b-1-py3-none-any.whl", tmp_path / "a-1-py3-none-any.whl"]
    for wheel in wheels:
        wheel.write_bytes(wheel.name.encode())
    deno = tmp_path / "deno.tgz"
    deno.write_bytes(b"deno")
    outs = []
    for order in (wheels, wheels[::-1]):
        out = io.BytesIO()
        code_interpreter.write_inputs_tar(order, deno, out)
        outs.append(out.getvalue())
    assert outs[0] == outs[1]
    with tarfile.open(fileobj=io.BytesIO(outs[0])) as tar:
        assert tar.getnames() == ["wheels/a-1-py3-none-any.whl", "wheels/b-1-py3-none-any.whl",
                                  "deno.tgz"]


def test_the_lock_holds_every_package_the_template_offers() -> None:
    lock = dict(pin.split("==") for pin in code_interpreter.PIP_LOCK)
    for requirement in code_interpreter.PIP_PACKAGES:
        name, version = requirement.split("==")
        assert lock[name.replace("_", "-")] == version, requirement


def test_the_template_and_the_tests_venv_pin_the_same_versions() -> None:
    script = (Path(__file__).resolve().parents[2] / "scripts" / "interpreter-venv.sh").read_text()
    pins = dict(line.split("=", 1) for line in script.splitlines()
                if line.split("=", 1)[0].endswith("_VERSION") and "=" in line
                and line[:1].isupper())
    for requirement in code_interpreter.PIP_PACKAGES:
        name, version = requirement.split("==")
        assert pins[f"{name.upper()}_VERSION"] == version, requirement
    assert pins["DENO_VERSION"] == code_interpreter.DENO_VERSION
