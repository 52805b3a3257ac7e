"""The import rules of DESIGN.md section 1, read from the source with `ast` (no module is imported).

- `common` imports no other package of the repository (third-party only);
- `kvtransfer` imports no role package (it may import `common`);
- `prefill_worker` and `decode_worker` never import each other (nor the router or the launcher);
- `router` imports no torch, no worker package, and from `common` only modules whose import never
  reaches torch: the closure of what importing them runs (package `__init__`s and module-level
  imports, not imports inside functions or under `if TYPE_CHECKING:`) is torch-free.

Folder rules for the rooms of `common/` (docs/architecture.md):
- `router` and `kvtransfer` take from `common` only its `wire` and `net` rooms;
- `common.wire` and `common.net` load nothing heavy (no torch, no transformers) when imported;
- `common`'s root holds at most 12 modules: composition and platform; everything else is in a room.

tests/unit/router/test_server_process.py checks the last rule at run time as well.

One-way rule for tool code: no module of a product package imports `benchmarks` or `tests`, names a
module of theirs in a string (what `importlib` or an entry point would load) or edits `sys.path`;
`benchmarks` imports nothing from `tests`; the fault injector `kvtransfer.faults` is loaded only by
name, through the transport registry.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("common", "kvtransfer", "prefill_worker", "decode_worker", "router", "deploy")
ROLES = ("prefill_worker", "decode_worker", "router", "deploy")
HEAVY = ("torch", "triton", "transformers", "flash_attn")  # what the router must never load


def modules(package: str) -> list[str]:
    return sorted(_module_name(p) for p in (ROOT / package).rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _path(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@cache
def _tree(module: str) -> ast.Module:
    path = _path(module)
    assert path is not None, module
    return ast.parse(path.read_text(), str(path))


def imports(module: str, module_level_only: bool = False) -> set[str]:
    """Absolute names `module` imports; `from pkg import name` also yields pkg.name when that is a
    module of the repository."""
    is_package = _path(module) == ROOT.joinpath(*module.split("."), "__init__.py")
    found: set[str] = set()
    for node in _walk(_tree(module), module_level_only):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node.level, node.module)
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names if _path(f"{base}.{a.name}") is not None)
    return found


def _resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    if level == 0:
        return name or ""
    parts = module.split(".")
    anchor = parts if is_package else parts[:-1]
    anchor = anchor[: len(anchor) - (level - 1)]
    return ".".join([*anchor, name] if name else anchor)


def _walk(tree: ast.Module, module_level_only: bool):
    """Every node, or (module_level_only) the nodes that run when the module is imported."""
    if not module_level_only:
        yield from ast.walk(tree)
        return
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def loaded_by(module: str) -> set[str]:
    """Every name importing `module` loads: its parent packages, and transitively their and its own
    module-level imports (third-party names are leaves)."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            current = ".".join(parts[:i])
            if current in seen:
                continue
            seen.add(current)
            if _path(current) is not None:
                todo.extend(imports(current, module_level_only=True))
    return seen


def top(name: str) -> str:
    return name.split(".")[0]


def violations(package: str, forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{module} imports {name}"
        for module in modules(package)
        for name in sorted(imports(module))
        if top(name) in forbidden
    ]


@pytest.mark.parametrize(
    "package, forbidden",
    [
        ("common", tuple(p for p in PACKAGES if p != "common")),
        ("kvtransfer", ROLES),
        ("prefill_worker", ("decode_worker", "router", "deploy")),
        ("decode_worker", ("prefill_worker", "router", "deploy")),
        ("router", ("kvtransfer", "prefill_worker", "decode_worker", "deploy", *HEAVY)),
    ],
)
def test_package_imports_follow_the_design(package: str, forbidden: tuple[str, ...]) -> None:
    assert violations(package, forbidden) == []


def test_router_uses_only_the_torch_free_part_of_common() -> None:
    used = {name for module in modules("router") for name in imports(module) if top(name) == "common"}
    assert "common.wire.messages" in used  # the walk sees the router's imports at all
    heavy = {
        name: sorted(n for n in loaded_by(name) if top(n) in HEAVY or top(n) in ROLES[:2])
        for name in sorted(used)
    }
    assert {name: found for name, found in heavy.items() if found} == {}


# The rooms of `common` each package may import (the package's own room aside).
COMMON_ROOMS_ALLOWED = {
    "router": ("common.wire", "common.net"),
    "kvtransfer": ("common.wire", "common.net"),
}
TORCH_FREE_ROOMS = ("common.wire", "common.net")
MAX_ROOT_MODULES = 12


def _in_rooms(name: str, rooms: tuple[str, ...]) -> bool:
    return any(name == room or name.startswith(room + ".") for room in rooms)


@pytest.mark.parametrize("package", sorted(COMMON_ROOMS_ALLOWED))
def test_package_takes_only_its_rooms_of_common(package: str) -> None:
    rooms = COMMON_ROOMS_ALLOWED[package]
    outside = sorted(
        f"{module} imports {name}"
        for module in modules(package)
        for name in imports(module)
        if top(name) == "common" and name != "common" and not _in_rooms(name, rooms)
    )
    assert outside == []


@pytest.mark.parametrize("room", TORCH_FREE_ROOMS)
def test_torch_free_room_loads_nothing_heavy(room: str) -> None:
    heavy = {
        module: sorted(n for n in loaded_by(module) if top(n) in HEAVY)
        for module in modules(room.replace(".", "/"))
    }
    assert {module: found for module, found in heavy.items() if found} == {}


def test_common_root_keeps_only_composition_and_platform() -> None:
    root = sorted(p.name for p in (ROOT / "common").glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, root


def test_the_checker_sees_what_it_must_forbid() -> None:
    # The rules above would pass vacuously if the walk missed imports: these are known to load torch.
    assert "torch" in loaded_by("common.llm_engine")
    assert "torch" not in loaded_by("common.wire.messages")
    assert "common.net.addresses" in imports("kvtransfer.config")
    assert modules("common/wire") and modules("common/net")
    assert "kvtransfer.device" in imports("kvtransfer.receiver")  # a relative import
    assert "torch" in imports("common.worker.engine_factory")


# The one-way rule: product code never reaches tool code (benchmarks/, tests/), neither by an import
# statement nor by naming a module in a string (importlib, entry points) or editing sys.path.
TOOL_CODE = ("benchmarks", "tests")
_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*(:[A-Za-z_][\w.]*)?")


def import_strings(module: str) -> set[str]:
    """String constants in `module` shaped like a module name (`a.b`, `a.b:attr`, a lone `a`)."""
    return {
        node.value
        for node in ast.walk(_tree(module))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and _MODULE_NAME.fullmatch(node.value)
    }


def edits_sys_path(module: str) -> bool:
    return any(
        isinstance(node, ast.Attribute) and node.attr == "path" and ast.unparse(node.value) == "sys"
        for node in ast.walk(_tree(module))
    )


@pytest.mark.parametrize("package", PACKAGES)
def test_product_imports_no_tool_code(package: str) -> None:
    assert violations(package, TOOL_CODE) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_product_names_no_tool_module_and_leaves_sys_path_alone(package: str) -> None:
    named = sorted(
        f"{module} names {text!r}"
        for module in modules(package)
        for text in import_strings(module)
        if top(text.split(":")[0]) in TOOL_CODE
    )
    assert named == []
    assert [module for module in modules(package) if edits_sys_path(module)] == []


def test_benchmarks_import_no_test_code() -> None:
    # What both share (tiny checkpoints, references) lives in the product's common/tools.
    assert modules("benchmarks") and violations("benchmarks", ("tests",)) == []


def test_only_the_registry_reaches_the_fault_injector() -> None:
    # kvtransfer/faults.py is test machinery: the transport registry loads it by name, only on demand.
    importers = [m for p in PACKAGES for m in modules(p) if "kvtransfer.faults" in imports(m)]
    assert importers == []
    assert "kvtransfer.faults:wrap_receiver" in import_strings("kvtransfer.registry")  # the scan sees names
