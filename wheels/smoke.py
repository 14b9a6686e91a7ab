"""Smoke test of an installed bubo wheel: the package imports from the environment it was
installed into, the native library loads, the kernel table answers on this CPU, and a GGUF file
written here by hand (no other package needed) reads back."""

import os
import struct
import sys
import tempfile

import numpy as np

import bubo
from bubo import GGUFFile, _kernels

assert "site-packages" in bubo.__file__, f"bubo imported from {bubo.__file__}, not the install"
print("bubo", bubo.__version__, "from", os.path.dirname(bubo.__file__))
print("CPU levels:", _kernels.supported_isas(), "best:", _kernels.best_isa())


def gguf_string(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


# A v3 file: two metadata keys, an F32 tensor of 32 and a Q8_0 tensor of 2 x 32.
values = np.arange(32, dtype=np.float32) / 7
q8 = _kernels.quantize(8, np.linspace(-1, 1, 64, dtype=np.float32))
header = b"GGUF" + struct.pack("<IQQ", 3, 2, 2)
header += gguf_string("general.architecture") + struct.pack("<I", 8) + gguf_string("llama")
header += gguf_string("smoke.answer") + struct.pack("<I", 4) + struct.pack("<I", 42)
header += gguf_string("t.f32") + struct.pack("<I", 1) + struct.pack("<Q", 32) + struct.pack("<IQ", 0, 0)
header += gguf_string("t.q8") + struct.pack("<I", 2) + struct.pack("<QQ", 32, 2) + struct.pack("<IQ", 8, 128)
header += b"\0" * (-len(header) % 32)
data = values.tobytes() + b"\0" * (128 - values.nbytes) + q8.tobytes()

with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "smoke.gguf")
    with open(path, "wb") as f:
        f.write(header + data)
    with GGUFFile(path) as g:
        assert g.metadata["smoke.answer"] == 42, g.metadata
        assert g.metadata["general.architecture"] == "llama"
        assert [t.name for t in g.tensors] == ["t.f32", "t.q8"]
        np.testing.assert_array_equal(g.tensor_data("t.f32"), values)
        rows = g.tensor_data("t.q8")
        assert rows.shape == (2, 34), rows.shape
        deq = np.concatenate([_kernels.dequantize(8, r.tobytes()) for r in rows])
        np.testing.assert_allclose(deq, np.linspace(-1, 1, 64), atol=1 / 127)
        act = _kernels.quantize(8, np.ones(32, np.float32))
        dot = _kernels.vec_dot(8, rows[0].tobytes(), act.tobytes())
        assert abs(dot - deq[:32].sum()) < 1e-3, (dot, deq[:32].sum())
# the server's packages are in the wheel, with their dependencies: the app answers without a model
from bubo.api.app import create_app  # noqa: E402
from bubo.api.config import ServerConfig  # noqa: E402
from bubo.engine.engine import Engine  # noqa: E402

client = create_app(Engine("smollm2:135m"), ServerConfig()).test_client()
assert client.get("/health").json == {"status": "ok"}
assert client.get("/ready").status_code == 503
# the chat page's files are in the wheel: its scripts too
page = client.get("/", headers={"Accept": "text/html"})
html = page.get_data(as_text=True)
assert page.status_code == 200 and 'id="bubo-config"' in html and "BuboMarkdown" in html, page.status_code
print("smoke test passed on", sys.platform)
