"""A static file server that honours HTTP Range requests (as object stores and CDNs do),
which sharded zarr reads rely on. Python's http.server ignores Range.

    python tests/range_http_server.py PORT DIRECTORY
"""

import os
import re
import sys
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer


class RangeHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass

    def send_head(self):
        rng = self.headers.get("Range")
        path = self.translate_path(self.path)
        if not rng or not os.path.isfile(path):
            return super().send_head()
        size = os.path.getsize(path)
        m = re.fullmatch(r"bytes=(\d*)-(\d*)", rng.strip())
        if not m:
            self.send_error(416)
            return None
        first, last = m.groups()
        if first == "":  # suffix: the last N bytes
            start, end = max(0, size - int(last)), size - 1
        else:
            start, end = int(first), (int(last) if last else size - 1)
        end = min(end, size - 1)
        if start > end:
            self.send_error(416)
            return None
        f = open(path, "rb")
        f.seek(start)
        self.send_response(206)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        self._remaining = end - start + 1
        return f

    def copyfile(self, source, outputfile):
        n = getattr(self, "_remaining", None)
        if n is None:
            return super().copyfile(source, outputfile)
        outputfile.write(source.read(n))
        self._remaining = None


if __name__ == "__main__":
    port, directory = int(sys.argv[1]), sys.argv[2]
    ThreadingHTTPServer(("127.0.0.1", port), partial(RangeHandler, directory=directory)).serve_forever()
