"""labkit.core.hardware: the one table of GPU figures, and lookups by jax device_kind."""

from __future__ import annotations

import pytest

from labkit.core.hardware import HARDWARE, hardware, ridge_intensity


def test_hardware_lookup_by_name_and_device_kind() -> None:
    assert hardware("H100 SXM").bf16_tflops == 989.0
    assert hardware("NVIDIA H100 80GB HBM3").name == "H100 SXM"
    assert hardware("NVIDIA H100 PCIe").name == "H100 PCIe"
    assert hardware("NVIDIA A100-SXM4-80GB").name == "A100 SXM"
    for hw in HARDWARE.values():
        assert hw.source and hw.bf16_tflops > hw.fp32_tflops
        assert hw.fp8_tflops is None or hw.fp8_tflops == pytest.approx(2 * hw.bf16_tflops, 0.01)


def test_unknown_gpu_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="known GPUs: H100 SXM"):
        hardware("RTX 9090")


def test_h100_variants_do_not_read_as_sxm() -> None:
    assert hardware("NVIDIA H100 NVL").name == "H100 NVL"
    assert hardware("NVIDIA H100 NVL").hbm_gbps == 3900.0
    assert hardware("NVIDIA H100 80GB HBM3").nvlink_gbps == 900.0


def test_tf32_is_the_f32_matmul_peak_on_tensor_cores() -> None:
    h100 = hardware("H100 SXM")
    assert h100.peak_tflops("tf32") == 494.5 and h100.peak_tflops("fp32") == 67.0
    assert hardware("A100 SXM").peak_tflops("tf32") == 156.0
    assert hardware("H100 PCIe").tf32_tflops == 378.0
    with pytest.raises(ValueError, match="no fp8"):
        hardware("A100 SXM").peak_tflops("fp8")
    with pytest.raises(ValueError, match="precision must be one of"):
        h100.peak_tflops("int4")  # type: ignore[arg-type]


def test_ridge_is_peak_over_bandwidth() -> None:
    assert ridge_intensity() == pytest.approx(989e12 / 3350e9)
    assert ridge_intensity("H200") < ridge_intensity("H100 SXM")
