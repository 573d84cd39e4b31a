"""bench.device_wheels: what a lent GPU machine is carried (no network there; its image's packages are listed)."""

from __future__ import annotations

from bench import device_wheels


def test_the_image_list_is_read_and_names_are_normalised():
    image = device_wheels.image_packages()
    assert {"torch", "triton", "numpy", "typing-extensions", "huggingface-hub"} <= image
    assert "fastapi" not in image and "sniffio" not in image


def test_wanted_is_what_the_image_lacks_and_never_torch_or_triton():
    image = device_wheels.image_packages()
    wanted = {device_wheels.requirement_name(r) for r in device_wheels.wanted(image)}
    assert {"fastapi", "langgraph", "gitpython", "gguf"} <= wanted
    assert not wanted & {"torch", "triton", "numpy", "transformers", "nsight-python"}
    assert all(";" not in r for r in device_wheels.wanted(image))


def test_wheel_file_names_map_to_distribution_names():
    assert device_wheels.wheel_name(device_wheels.Path("langgraph_checkpoint_sqlite-3.1.2-py3-none-any.whl")) \
        == "langgraph-checkpoint-sqlite"
    assert device_wheels.requirement_name("uvloop>=0.19; sys_platform != 'win32'") == "uvloop"
