"""The registry of search methods: names are unique, seeding ranks order the seeds,
discovery walks the package and the ``placetool.methods`` entry points, and an import
that fails for any reason but a missing optional dependency is raised."""

from __future__ import annotations

import ast
from importlib.metadata import entry_points
from pathlib import Path

import pytest

import placetool.search
from placetool.search import Budget, registry

SEARCH = Path(registry.__file__).parent


def test_rl_is_found_through_its_entry_point_and_search_never_names_it():
    assert "placetool.rl.method" in {ep.value for ep in entry_points(group=registry.ENTRY_POINTS)}
    assert registry.info("rl").module == "placetool.rl.method"
    for path in SEARCH.glob("*.py"):
        assert "placetool.rl" not in path.read_text(), f"{path.name} names rl"


def test_seed_ranks_order_the_seeding_methods():
    t = registry.table()
    seeds = registry.seed_methods()
    assert [t[n].seed_rank for n in seeds] == sorted(t[n].seed_rank for n in seeds)
    assert seeds[:3] == ("single", "round-robin", "expert")
    assert {"sa", "tpe", "exact", "rl", "random"}.isdisjoint(seeds)


def test_a_name_taken_by_another_function_is_refused(monkeypatch):
    monkeypatch.setattr(registry, "REGISTRY", dict(registry.table()))

    def heft(problem, budget, seed, tracker):
        """Another heft."""

    with pytest.raises(ValueError, match="'heft' .* is already registered by placetool.search.listsched"):
        registry.register("heft")(heft)
    # a module imported anew registers its own functions again
    again = registry.table()["sa"].fn
    registry.register("sa", seed_rank=None)(again)
    assert registry.REGISTRY["sa"].fn is again


@pytest.fixture
def rediscover(monkeypatch, tmp_path):
    """Discovery run again over the package plus ``tmp_path``; returns a writer of
    modules there."""
    registry.table()
    monkeypatch.setattr(registry, "REGISTRY", dict(registry.REGISTRY))
    monkeypatch.setattr(registry, "UNAVAILABLE", {})
    monkeypatch.setattr(registry, "_discovered", False)
    monkeypatch.setattr(placetool.search, "__path__", [*placetool.search.__path__, str(tmp_path)])

    def write(name, code):
        (tmp_path / f"{name}.py").write_text(code)
        return f"placetool.search.{name}"

    return write


def test_a_new_module_of_the_package_registers_without_a_list(rediscover):
    rediscover("zz_test_method", "from placetool.search.registry import register\n\n"
                                 "@register('zz-test', seed_rank=99)\ndef zz(problem, budget, seed, tracker):\n"
                                 "    '''A test method. It does nothing.'''\n")
    assert registry.info("zz-test").summary == "A test method"
    assert registry.seed_methods()[-1] == "zz-test"


def test_a_broken_import_in_a_method_module_is_raised(rediscover):
    rediscover("zz_broken", "from placetool.search.registry import no_such_name\n")
    with pytest.raises(ImportError, match="no_such_name"):
        registry.table()
    assert not registry._discovered


def test_a_missing_module_that_is_no_optional_dependency_is_raised(rediscover):
    rediscover("zz_typo", "import nmupy_not_a_dependency\n")
    with pytest.raises(ModuleNotFoundError, match="nmupy_not_a_dependency"):
        registry.table()


def test_a_missing_optional_dependency_leaves_its_methods_out(rediscover, monkeypatch):
    monkeypatch.setattr(registry, "_optional_modules", lambda: frozenset({"optional_dep_not_installed"}))
    mod = rediscover("zz_optional", "import optional_dep_not_installed.sub\n")
    assert "sa" in registry.table()
    assert registry.UNAVAILABLE == {mod: "optional_dep_not_installed"}


def test_the_extras_are_the_optional_dependencies():
    assert {"tensorflow", "ortools"} <= registry._optional_modules()
    assert not {"numpy", "optuna", "dask"} & registry._optional_modules()


LAYERS = ["errors", "problem", "tracker", "registry", "seeding"]


@pytest.mark.parametrize("i", range(len(LAYERS)), ids=LAYERS)
def test_each_layer_imports_only_the_layers_above_it(i):
    tree = ast.parse((SEARCH / f"{LAYERS[i]}.py").read_text())
    imported = {n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.level == 1}
    assert imported <= set(LAYERS[:i]) | {"memory"}, f"search/{LAYERS[i]}.py imports {imported}"


def test_budget_is_one_class_everywhere():
    assert registry.DEFAULT_BUDGET.__class__ is Budget is placetool.search.Budget
