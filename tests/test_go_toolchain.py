"""Go for the cluster's builds on a machine without it (tools/go_toolchain.py): the pinned
release fetched from a module proxy (here one on loopback, serving a toolchain module
zip laid out as proxy.golang.org serves one), unpacked with its commands executable;
a machine's own `go` is used as it is."""

from __future__ import annotations

import http.server
import io
import os
import subprocess
import threading
import zipfile
from pathlib import Path

from tools.go_toolchain import GO_VERSION, MODULE, _arch, go_dir


def toolchain_zip(version: str) -> bytes:
    """A toolchain module's zip: every file under `<module>@<tag>/`, no file modes."""
    prefix = f"{MODULE}@v0.0.1-go{version}.linux-{_arch()}/"
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr(prefix + "bin/go", f"#!/bin/sh\necho go version go{version}\n")
        z.writestr(prefix + f"pkg/tool/linux_{_arch()}/compile", "#!/bin/sh\n")
        z.writestr(prefix + "VERSION", f"go{version}\n")
    return out.getvalue()


def test_without_go_the_pinned_toolchain_is_fetched_once_and_runs(tmp_path: Path,
                                                                   monkeypatch) -> None:
    version = GO_VERSION
    body = toolchain_zip(version)
    asked = []

    class Proxy(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("THROTTLEDJOB_CACHE", str(tmp_path / "cache"))
    env = {"PATH": str(tmp_path / "empty"),
           "GOPROXY": f"http://127.0.0.1:{server.server_address[1]},direct"}
    try:
        first = go_dir(env)
        again = go_dir(env)
    finally:
        server.shutdown()
    assert first == again == tmp_path / "cache" / "go" / f"go{version}" / "bin"
    assert asked == [f"/{MODULE}/@v/v0.0.1-go{version}.linux-{_arch()}.zip"]   # once
    ran = subprocess.run([str(first / "go")], capture_output=True, text=True, timeout=30)
    assert ran.stdout.strip() == f"go version go{version}"
    assert os.access(first.parent / "pkg" / "tool" / f"linux_{_arch()}" / "compile", os.X_OK)
    assert sorted(p.name for p in (tmp_path / "cache" / "go").iterdir()) == [f"go{version}"]


def test_a_machines_own_go_is_used(tmp_path: Path) -> None:
    own = tmp_path / "bin"
    own.mkdir()
    (own / "go").write_text("#!/bin/sh\n")
    (own / "go").chmod(0o755)
    assert go_dir({"PATH": str(own)}) == own
