"""Where the checks of the GPU validation suite that run without a GPU (test_gpu_tooling.py,
test_bundle.py) find the source and build trees, what kind of build it is, and the environment
their children start from."""
import os

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.abspath(os.environ.get("GPUSHIM_BUILD_DIR") or os.path.join(ROOT, "build"))


def sanitizer_build():
    """GPUSHIM_SANITIZE of the build tree ("" for a normal build)."""
    try:
        with open(os.path.join(BUILD, "CMakeCache.txt")) as f:
            for line in f:
                if line.startswith("GPUSHIM_SANITIZE:"):
                    return line.split("=", 1)[1].strip()
    except OSError:
        pass
    return ""


def clean_env(**extra):
    """This process's environment without gpushim's, the simulated device's or the loader's settings,
    plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GPUSHIM_", "FAKECUDA_")) and k not in ("LD_PRELOAD", "LD_LIBRARY_PATH")}
    env.update(extra)
    return env
