"""``info``'s ROCm release in a user's words, from the HIP version (``__main__.rocm_release``)."""
import pytest

from hipmr_ctypes.__main__ import print_info, rocm_release


@pytest.mark.parametrize("version, words", [
    ((5, 2, 21153), "ROCm 5.2"), ((5, 7, 31921), "ROCm 5.7"), ((6, 0, 32830), "ROCm 6.0"),
    ((6, 4, 43484), "ROCm 6.4"), ((7, 0, 51831), "ROCm 7.0"), ((7, 2, 53211), "ROCm 7.2"),
    (("6", "4", "43484"), "ROCm 6.4"),                       # the strings of info's report
    ((7, 12, 60430), "a ROCm 7 development build"),         # HIP 7.12 is no ROCm release
    ((5, 8, 0), "a ROCm 5 development build"),
    ((4, 5, 0), None), ((8, 0, 0), None), ((13, 0, 0), None), ((6,), None), (None, None),
    (("x", "1"), None), ((6, -1, 0), None),
])
def test_rocm_release(version, words):
    assert rocm_release(version) == words


def test_info_prints_the_release_beside_the_runtime_version(capsys):
    report = {"package": "0", "python": "3", "platform": "amd", "library": "/x/libamdhip64.so.6",
              "runtime_version": "6.4.43484", "driver_version": "6.4.43484",
              "rocm_release": "ROCm 6.4", "devices": []}
    print_info(report)
    assert "runtime version: 6.4.43484 (ROCm 6.4); driver version: 6.4.43484" in \
        capsys.readouterr().out
