"""A PEP 517 build backend with no requirements, so `pip install ./python` works offline: the
wheel holds longstraw/__init__.py and the shared library built by CMake (build/liblongstraw.so
of this checkout, or $LONGSTRAW_LIB), tagged for this platform."""
import base64
import hashlib
import os
import sysconfig
import zipfile

NAME, VERSION = "longstraw", "0.1.0"
HERE = os.path.dirname(os.path.abspath(__file__))


def _library():
    lib = os.environ.get("LONGSTRAW_LIB") or os.path.join(HERE, "..", "build", "liblongstraw.so")
    if not os.path.exists(lib):
        raise RuntimeError("longstraw: %s not found: build LongStraw first (cmake -S . -B build && cmake --build "
                           "build), or set LONGSTRAW_LIB" % lib)
    return os.path.realpath(lib)


def _tag():
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return "py3-none-" + plat


def _metadata():
    return ("Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: Long-context GRPO: the capture/score/replay "
            "transaction from Python\nRequires-Python: >=3.9\nRequires-Dist: numpy\n" % (NAME, VERSION))


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    d = os.path.join(metadata_directory, "%s-%s.dist-info" % (NAME, VERSION))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "METADATA"), "w") as f:
        f.write(_metadata())
    return os.path.basename(d)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    tag = _tag()
    dist = "%s-%s.dist-info" % (NAME, VERSION)
    files = [("longstraw/__init__.py", open(os.path.join(HERE, "longstraw", "__init__.py"), "rb").read()),
             ("longstraw/liblongstraw.so", open(_library(), "rb").read()),
             (dist + "/METADATA", _metadata().encode()),
             (dist + "/WHEEL", ("Wheel-Version: 1.0\nGenerator: longstraw_build\nRoot-Is-Purelib: false\nTag: %s\n"
                                % tag).encode())]
    record = []
    for name, data in files:
        h = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append("%s,sha256=%s,%d" % (name, h, len(data)))
    record.append(dist + "/RECORD,,")
    files.append((dist + "/RECORD", ("\n".join(record) + "\n").encode()))
    wheel = "%s-%s-%s.whl" % (NAME, VERSION, tag)
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel), "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files:
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if name.endswith(".so") else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return wheel
