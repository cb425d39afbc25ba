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
