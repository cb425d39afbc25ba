"""The AOTInductor codegen workaround of compile/aoti.py (no compile: the cache it guards, directly)."""

import inspect
import itertools

import pytest

from boundgen.compile.aoti import unique_int_array_owners

cpp_wrapper = pytest.importorskip("torch._inductor.codegen.cpp_wrapper_cpu")
common = pytest.importorskip("torch._inductor.codegen.common")


def _cache_keyed_by_id() -> bool:
    return "id(" in inspect.getsource(cpp_wrapper.CppWrapperCpu.codegen_int_array_var)


def _stale_declarations(rounds: int = 50) -> int:
    """Declare one int array in a buffer, free the buffer, declare the same array in a new buffer:
    count the new buffers that got a name but no declaration."""
    wrapper = cpp_wrapper.CppWrapperCpu.__new__(cpp_wrapper.CppWrapperCpu)
    wrapper.int_array_id = itertools.count()
    wrapper.codegen_int_array_var_cache, wrapper.declared_int_array_vars = {}, set()
    stale = 0
    for _ in range(rounds):
        first = common.IndentedBuffer()
        wrapper.codegen_int_array_var("{1, 2, 3}", first.writeline)
        del first
        second = common.IndentedBuffer()
        name = wrapper.codegen_int_array_var("{1, 2, 3}", second.writeline)
        stale += name not in second.getvalue()
    return stale


def test_every_buffer_gets_its_own_declaration():
    if not _cache_keyed_by_id():
        pytest.skip("this torch caches int arrays differently")
    with unique_int_array_owners():
        assert _stale_declarations() == 0
    original = cpp_wrapper.CppWrapperCpu.codegen_int_array_var
    assert original.__name__ == "codegen_int_array_var" and "boundgen" not in original.__module__


def test_the_cache_reuses_freed_buffers_without_the_workaround():
    """Documents why the workaround exists: if torch fixes its cache this fails, and the
    workaround can go."""
    if not _cache_keyed_by_id():
        pytest.skip("this torch caches int arrays differently")
    assert _stale_declarations() > 0


def _keyed_by_bound_method(self, int_array, writeline, known_statically=False, graph=None):
    """torch 2.11's cache, as its source reads: keyed on id(writeline), the bound method itself."""
    key = (int_array, id(writeline), known_statically, id(graph) if graph else None)
    if key not in self.codegen_int_array_var_cache:
        self.codegen_int_array_var_cache[key] = self._codegen_int_array_var_impl(int_array, writeline, known_statically)
    return self.codegen_int_array_var_cache[key]


def _stale_in_live_buffers(rounds: int = 50) -> int:
    """Two live buffers, a declaration in each through a fresh bound method: with the cache keyed
    on the bound method, the second can reuse the first's freed method id and get no declaration."""
    wrapper = cpp_wrapper.CppWrapperCpu.__new__(cpp_wrapper.CppWrapperCpu)
    wrapper.int_array_id = itertools.count()
    wrapper.codegen_int_array_var_cache, wrapper.declared_int_array_vars = {}, set()
    stale = 0
    for _ in range(rounds):
        first, second = common.IndentedBuffer(), common.IndentedBuffer()
        wrapper.codegen_int_array_var("{4, 5}", first.writeline)
        name = wrapper.codegen_int_array_var("{4, 5}", second.writeline)
        stale += name not in second.getvalue()
    return stale


def test_a_cache_keyed_on_the_bound_method_gets_its_declarations_too(monkeypatch):
    if not hasattr(cpp_wrapper.CppWrapperCpu, "_codegen_int_array_var_impl"):
        pytest.skip("this torch declares int arrays differently")
    monkeypatch.setattr(cpp_wrapper.CppWrapperCpu, "codegen_int_array_var", _keyed_by_bound_method)
    assert _stale_in_live_buffers() > 0  # the failure of torch 2.11, reproduced
    with unique_int_array_owners():
        assert _stale_in_live_buffers() == 0
