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


def _recipe(r: str = "c" * 64, inputs: str = "a" * 64,
            package: str = "b" * 64) -> code_interpreter.Recipe:
    return code_interpreter.recipe(r_hash=r, inputs_hash=inputs, package_hash=package)


def test_the_recipe_is_a_valid_build_request() -> None:
    recipe = _recipe()
    plan = plan_from_e2b(from_image=None, from_template="base", registry=None,
                         steps=recipe.steps, start_cmd=recipe.start_cmd,
                         ready_cmd=recipe.ready_cmd, force=False)
    steps = plan.stages[0].steps
    assert [step.kind for step in steps] == ["USER", "COPY", "RUN", "COPY", "RUN", "COPY",
                                             "USER", "WORKDIR"]
    # R lowest: new wheels or a new server leave its layer as it is.
    assert [steps[i].files_hash for i in (1, 3, 5)] == ["c" * 64, "a" * 64, "b" * 64]
    assert plan.start_cmd is not None and "--port 49999" in plan.start_cmd
    # The installs need no network: only the debs and wheels the node brought.
    assert "dpkg --install" in steps[2].args[0] and "apt" not in steps[2].args[0]
    assert "--no-index" in steps[4].args[0]


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
    tags = {_recipe(package=h).tag for h in ("b" * 64, "c" * 64)}
    assert len(tags) == 2
    # Other debs (another version of one) name another recipe too.
    assert _recipe(r="d" * 64).tag != _recipe().tag


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


def test_the_debs_context_is_reproducible(tmp_path: Path) -> None:
    debs = [tmp_path / "r-base-core_4.2.2_amd64.deb", tmp_path / "libz_1%3a1.0_amd64.deb"]
    for deb in debs:
        deb.write_bytes(deb.name.encode())
    outs = []
    for order in (debs, debs[::-1]):
        out = io.BytesIO()
        code_interpreter.write_debs_tar(order, out)
        outs.append(out.getvalue())
    assert outs[0] == outs[1]
    with tarfile.open(fileobj=io.BytesIO(outs[0])) as tar:
        assert tar.getnames() == ["debs/libz_1%3a1.0_amd64.deb", "debs/r-base-core_4.2.2_amd64.deb"]
        assert {m.mtime for m in tar.getmembers()} == {0}


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
