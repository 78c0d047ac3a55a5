"""pytest setup: the package from this tree, the plugin from $HIXL_KV_PLUGIN (the test
command sets it to build-test's) or a build of this tree. torch is imported here, so a
missing torch fails the whole run at collection instead of skipping anything."""

import glob
import os
import sys

import pytest
import torch  # noqa: F401  (required: Debian's python3-torch)

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)


def _find_plugin():
    env = os.environ.get("HIXL_KV_PLUGIN")
    if env:
        return env
    for d in ("build-test", "build-py", "build"):
        p = os.path.join(TOP, d, "plugin", "libhixl_kv_connector.so")
        if os.path.exists(p):
            return p
    hits = glob.glob(os.path.join(TOP, "build*", "plugin", "libhixl_kv_connector.so"))
    return hits[0] if hits else None


PLUGIN = _find_plugin()
if PLUGIN:
    os.environ["HIXL_KV_PLUGIN"] = PLUGIN  # the instances the hand-off tests start inherit it


@pytest.fixture(scope="session")
def plugin_path():
    if not PLUGIN or not os.path.exists(PLUGIN):
        pytest.fail("no libhixl_kv_connector.so: build it (cmake --build BUILD --target hixl_kv_connector) "
                    "and set HIXL_KV_PLUGIN to it")
    return PLUGIN
