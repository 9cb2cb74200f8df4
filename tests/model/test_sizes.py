"""Sizes as strings wherever a size is configured."""
from __future__ import annotations

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes._device_sizes import config_size
from hipmr_ctypes._sizes import DeviceFraction, parse_bytes, parse_size

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


@pytest.mark.parametrize("text, expected", [
    ("4MiB", 4 * MiB), ("2 GB", 2 * 10**9), ("512kib", 512 * KiB), ("512KIB", 512 * KiB),
    ("1kB", 1000), ("1KB", 1000), ("1.5GiB", 3 * GiB // 2), ("0.5 KiB", 512), ("1000", 1000),
    ("1000B", 1000), ("1000 b", 1000), (" 7 MB ", 7 * 10**6), ("1TiB", 1 << 40),
    ("2PB", 2 * 10**15), ("1EiB", 1 << 60), ("0", 0), ("1e3", 1000), ("2.5e3kB", 2500000),
    ("1.5e3", 1500),
    (".5MiB", MiB // 2), ("1.1KiB", 1126),      # a fraction of a byte is dropped
])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["2k", "2K", "4M", "1 G", "", " ", "MiB", "-1MiB", "1 MiBs",
                                  "1,000", "0x10", "1/2 GiB", "4 MiB 2", "nan", "inf GB",
                                  "1__0", "1e5000B", "0.5", "1.5", "80%"])
def test_bad_size_strings(text):
    with pytest.raises(ValueError, match="Could not parse") as info:
        parse_bytes(text)
    assert repr(text) in str(info.value)


def test_config_size_names_the_argument_and_uses_the_size_rules():
    assert config_size("4MiB", "initial_pool_size") == 4 * MiB
    assert config_size(4096, "x") == 4096
    with pytest.raises(ValueError, match=r"initial_pool_size: Could not parse '4 Mb s'"):
        config_size("4 Mb s", "initial_pool_size")
    with pytest.raises(ValueError, match="larger than 2\\*\\*63"):
        config_size("16EiB", "limit")
    with pytest.raises(ValueError, match="larger than 2\\*\\*63"):
        config_size("1e999 B", "limit")
    with pytest.raises(ValueError, match="limit: 1.5 as a fraction of the device's memory"):
        config_size(1.5, "limit")
    with pytest.raises(TypeError, match="limit"):
        config_size(True, "limit")
    with pytest.raises(TypeError):
        parse_bytes(b"4MiB")


def test_size_strings_where_sizes_are_configured():
    up = hmr.DeviceMemoryResource()
    pool = hmr.PoolResource(up, "1MiB", "4 MiB")
    assert pool.pool_size() == MiB and pool.maximum_pool_size == 4 * MiB
    assert hmr.PoolResource(up, maximum_pool_size="2MiB").maximum_pool_size == 2 * MiB
    assert hmr.LimitingResource(up, "2 kB").get_allocation_limit() == 2000
    assert hmr.FixedSizeResource(up, block_size="64KiB").block_size == 64 * KiB
    assert hmr.AlignedResource(up, 512, threshold="1 MiB").threshold == MiB
    mr = hmr.AsyncMemoryResource(initial_pool_size="1MiB", release_threshold="1GB")
    assert mr.pool.release_threshold == 10**9
    mr.pool.release_threshold = "2 GiB"
    assert mr.pool.release_threshold == 2 * GiB
    with pytest.raises(ValueError, match="release_threshold: Could not parse"):
        mr.pool.release_threshold = "lots"
    assert mr.pool.release_threshold == 2 * GiB
    mr.close()


@pytest.mark.parametrize("make", [
    lambda up: hmr.PoolResource(up, "2k"),
    lambda up: hmr.PoolResource(up, None, "1 MiBs"),
    lambda up: hmr.LimitingResource(up, "1G"),
    lambda up: hmr.FixedSizeResource(up, block_size="big"),
    lambda up: hmr.AsyncMemoryResource(initial_pool_size="1 M"),
])
def test_bad_size_strings_are_refused_before_anything_is_allocated(make, emulator):
    up = hmr.DeviceMemoryResource()
    before = hmr.Device().memory_info()
    with pytest.raises(ValueError, match="Could not parse"):
        make(up)
    assert hmr.Device().memory_info() == before


def test_initial_above_maximum_names_both():
    with pytest.raises(ValueError, match="initial_pool_size=4MiB.*maximum_pool_size=2MiB"):
        hmr.PoolResource(hmr.DeviceMemoryResource(), "4MiB", "2MiB")


# ---- the one grammar: fractions of the device's memory and the rule for what is ambiguous ----
@pytest.mark.parametrize("value, fraction", [
    ("80%", 0.8), (" 50 % ", 0.5), ("100%", 1.0), ("0.5%", 0.005), (0.8, 0.8), (1.0, 1.0),
    ("0.25", 0.25), ("1.0", 1.0), (".5", 0.5)])
def test_fractions_of_the_device(value, fraction):
    parsed = parse_size(value)
    assert isinstance(parsed, DeviceFraction) and parsed.fraction == pytest.approx(fraction)
    total = 1 << 30
    assert parsed.of(total) == int(total * fraction) // 256 * 256


@pytest.mark.parametrize("value", ["0%", "101%", "150 %", 0.0, 1.5, -0.5, "0.0", "2.5",
                                   float("nan"), float("inf")])
def test_fractions_out_of_range_are_refused(value):
    with pytest.raises(ValueError):
        parse_size(value)


@pytest.mark.parametrize("text, hint", [("512M", "512MiB"), ("2k", "2KiB"), ("1 G", "1GiB"),
                                        ("1.5", "fraction")])
def test_what_is_ambiguous_is_refused_saying_what_to_write(text, hint):
    with pytest.raises(ValueError, match=hint):
        parse_size(text)


def test_fractions_resolve_against_the_device(emulator):
    total = hmr.Device().memory_info()[1]
    assert config_size("50%", "limit") == total // 2 // 256 * 256
    assert config_size(0.25, "limit", device=0) == total // 4 // 256 * 256
    with pytest.raises(ValueError, match="block_size"):
        config_size("50%", "block_size", fraction=False)
    with pytest.raises(TypeError, match="threshold"):
        config_size(0.5, "threshold", fraction=False)
    up = hmr.DeviceMemoryResource()
    assert hmr.LimitingResource(up, "25%").get_allocation_limit() == total // 4 // 256 * 256
    pool = hmr.PoolResource(up, "1%", 0.5)
    assert pool.maximum_pool_size == total // 2 // 256 * 256
    pool.release()
    with pytest.raises(ValueError, match="block_size"):
        hmr.FixedSizeResource(up, block_size="1%")
    mr = hmr.AsyncMemoryResource(release_threshold="50%")
    assert mr.pool.release_threshold == total // 2 // 256 * 256
    mr.pool.release_threshold = 0.25
    assert mr.pool.release_threshold == total // 4 // 256 * 256
    mr.close()


def test_reinitialize_takes_fractions_per_device(emulator):
    total = hmr.Device().memory_info()[1]
    try:
        hmr.reinitialize(pool_allocator=True, initial_pool_size="10%", maximum_pool_size=0.5)
        pool = hmr.get_current_device_resource()
        assert pool.maximum_pool_size == total // 2 // 256 * 256
        assert pool.pool_size() >= total // 10 // 256 * 256
        with pytest.raises(ValueError, match="initial_pool_size: Could not parse"):
            hmr.reinitialize(pool_allocator=True, initial_pool_size="10 M")
    finally:
        hmr.reinitialize()


# ---- the notation never changes the reading, only the value does ----------------------------
@pytest.mark.parametrize("text, same_as", [
    ("0.5e0", "0.5"), ("5e-1", "0.5"), ("50e-2", "0.5"), ("1.0e0", "1.0"), ("0.25E0", "0.25")])
def test_exponent_fractions_read_as_their_decimal(text, same_as):
    parsed, plain = parse_size(text), parse_size(same_as)
    assert isinstance(parsed, DeviceFraction) and parsed == plain
    assert parsed.of(1 << 30) == plain.of(1 << 30)
    with pytest.raises(ValueError, match="fraction"):
        parse_bytes(text)                      # never 0 bytes


@pytest.mark.parametrize("text", ["1.5e0", "15e-1", "2.0", "1000.0", "1.25e1"])
def test_unitless_non_whole_or_pointed_above_one_is_ambiguous(text):
    with pytest.raises(ValueError, match="has no unit"):
        parse_size(text)                       # never 1 byte, never 1000 bytes silently
    with pytest.raises(ValueError, match="Could not parse"):
        parse_bytes(text)


@pytest.mark.parametrize("text, expected", [("1e3", 1000), ("1.5e3", 1500), ("2E2", 200),
                                            ("12.5e1", 125), ("1e2 B", 100), ("1.5e0 KiB", 1536),
                                            ("0.5e0 B", 0)])
def test_whole_numbers_with_an_exponent_and_any_number_with_a_unit_are_bytes(text, expected):
    assert parse_size(text) == expected == parse_bytes(text)


def test_fractions_are_exact_and_huge_texts_are_refused_cleanly():
    # 70% of 256000 is 179200, a multiple of 256 (the float 0.7 is a little less than 0.7)
    assert parse_size("70%").of(256000) == 179200
    assert parse_size("0.7").of(10**12) == 7 * 10**11 // 256 * 256
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        parse_size("1" + "0" * 400 + "%")
