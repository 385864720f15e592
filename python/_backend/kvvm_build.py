"""A minimal PEP 517 / PEP 660 build backend for the pure-Python kvvm package.

Standard library only (zipfile, hashlib), so pip's isolated build needs nothing from an
index: `pip install ./python` works offline. It builds one py3-none-any wheel of the
kvvm/ directory (metadata from pyproject.toml's [project] table, read with tomllib where
there is one, else with the tiny reader below), an sdist, and an editable wheel (a .pth
file pointing at this directory).
"""
import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = "kvvm"


def _project():
    path = os.path.join(HERE, "pyproject.toml")
    with open(path, "rb") as f:
        data = f.read()
    try:
        import tomllib
        return tomllib.loads(data.decode())["project"]
    except ImportError:
        return _mini_toml_project(data.decode())


def _mini_toml_project(text):
    """Reads the [project] table's simple keys (strings and string lists) only."""
    out, table = {}, None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^\[(.+)\]$", line)
        if m:
            table = m.group(1).strip()
            continue
        if table != "project" or "=" not in line:
            continue
        k, v = (x.strip() for x in line.split("=", 1))
        if v.startswith('"'):
            out[k] = v.strip('"')
        elif v.startswith("["):
            out[k] = re.findall(r'"([^"]*)"', v)
    return out


def _metadata():
    p = _project()
    lines = ["Metadata-Version: 2.1", "Name: %s" % p["name"], "Version: %s" % p["version"],
             "Summary: %s" % p.get("description", "")]
    if p.get("requires-python"):
        lines.append("Requires-Python: %s" % p["requires-python"])
    for d in p.get("dependencies", []):
        lines.append("Requires-Dist: %s" % d)
    for extra, deps in (p.get("optional-dependencies") or {}).items():
        lines.append("Provides-Extra: %s" % extra)
        for d in deps:
            lines.append('Requires-Dist: %s; extra == "%s"' % (d, extra))
    readme = os.path.join(HERE, "README.md")
    body = ""
    if os.path.exists(readme):
        lines.append("Description-Content-Type: text/markdown")
        with open(readme, encoding="utf-8") as f:
            body = "\n" + f.read()
    return p["name"], p["version"], "\n".join(lines) + "\n" + body


def _files():
    root = os.path.join(HERE, PKG)
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for f in sorted(files):
            if f.endswith((".pyc", ".pyo")):
                continue
            full = os.path.join(d, f)
            yield full, os.path.relpath(full, HERE).replace(os.sep, "/")


def _record_line(arc, data):
    h = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (arc, h, len(data))


def _write_wheel(wheel_directory, entries):
    name, version, meta = _metadata()
    dist = "%s-%s" % (name, version)
    fname = "%s-py3-none-any.whl" % dist
    info = "%s.dist-info" % dist
    entries = list(entries) + [
        ("%s/METADATA" % info, meta.encode()),
        ("%s/WHEEL" % info, b"Wheel-Version: 1.0\nGenerator: kvvm_build\n"
                             b"Root-Is-Purelib: true\nTag: py3-none-any\n"),
        ("%s/top_level.txt" % info, ("%s\n" % PKG).encode()),
    ]
    record = [_record_line(a, d) for a, d in entries] + ["%s/RECORD,," % info]
    path = os.path.join(wheel_directory, fname)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in entries:
            zi = zipfile.ZipInfo(arc, (1980, 1, 1, 0, 0, 0))
            zi.compress_type = zipfile.ZIP_DEFLATED
            zi.external_attr = 0o644 << 16
            z.writestr(zi, data)
        z.writestr(zipfile.ZipInfo("%s/RECORD" % info, (1980, 1, 1, 0, 0, 0)),
                   "\n".join(record) + "\n")
    return fname


def _dist_info(metadata_directory):
    name, version, meta = _metadata()
    info = "%s-%s.dist-info" % (name, version)
    os.makedirs(os.path.join(metadata_directory, info), exist_ok=True)
    with open(os.path.join(metadata_directory, info, "METADATA"), "w") as f:
        f.write(meta)
    return info


# ---- PEP 517 hooks -------------------------------------------------------------------------
def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    return _dist_info(metadata_directory)


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    entries = []
    for full, arc in _files():
        with open(full, "rb") as f:
            entries.append((arc, f.read()))
    return _write_wheel(wheel_directory, entries)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, [("%s_editable.pth" % PKG, (HERE + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    name, version, meta = _metadata()
    base = "%s-%s" % (name, version)
    fname = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, fname), "w:gz") as t:
        paths = ["pyproject.toml", "README.md"]
        paths += [os.path.join("_backend", "kvvm_build.py")]
        paths += [arc for _, arc in _files()]
        for rel in paths:
            full = os.path.join(HERE, rel)
            if os.path.exists(full):
                t.add(full, arcname="%s/%s" % (base, rel), recursive=False)
        data = meta.encode()
        ti = tarfile.TarInfo("%s/PKG-INFO" % base)
        ti.size = len(data)
        t.addfile(ti, io.BytesIO(data))
    return fname
