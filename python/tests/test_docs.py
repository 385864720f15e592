"""The example of docs/python.md runs as written."""
import os
import re
import subprocess
import sys

import pytest

import kvvm

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "python.md")


def test_docs_example_runs():
    pytest.importorskip("torch")
    if not os.path.exists(DOC):
        pytest.skip("docs/python.md is not beside this test tree (installed copy)")
    code = re.search(r"```python\n(.*?)```", open(DOC).read(), re.S).group(1)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(kvvm.__file__)) + os.pathsep + \
        env.get("PYTHONPATH", "")
    env["KVVM_BACKEND"] = "emulated"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    toks = eval(r.stdout.strip().splitlines()[-1])
    assert len(toks) == 13 and toks[:3] == [1, 2, 3]


def test_regress_docs_list_every_config_keyword_and_flag():
    """Bug (issue 32): Context's keyword list omitted store_url, store_timeout_ms and
    create_at_open, and the flags omitted F_POOL_VIEW."""
    if not os.path.exists(DOC):
        pytest.skip("docs/python.md is not beside this test tree (installed copy)")
    text = open(DOC).read()
    para = text[text.index("### `kvvm.Context(**config)`"):]
    para = para[:para.index("\n\n", para.index("Keywords are"))]
    fields = {n for n, _ in kvvm._lib.Config._fields_} - {"size"}
    missing = sorted(f for f in fields if "`%s`" % f not in para)
    assert not missing, "docs/python.md's Context keywords lack %s" % missing
    flags = sorted(n for n in dir(kvvm) if n.startswith("F_"))
    missing = [f for f in flags if "kvvm.%s" % f not in para]
    assert not missing, "docs/python.md's flags lack %s" % missing
