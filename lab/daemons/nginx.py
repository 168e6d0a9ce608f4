"""nginx in lab namespaces: the load balancer's backends (NginxServer), and its
L4 and L7 proxy peers (NginxProxy).

    >>> with NginxServer(ns, "198.18.5.11", 8080) as web:      # doctest: +SKIP
    ...     ...                                               # GET / returns web.body
    ...     web.requests()                                    # how many it served

nginx, one worker, serving one small static file: Python's http.server would
be the bottleneck of every measurement. A lab.daemons.Daemon: its configuration,
document root, pid file and logs live under /run/vtap-lab/<ns>.<port>.nginx.
The access log (one line per request, the client's address first) lets a test
count who served what; benchmarks turn it off (log=False), it costs a write
per request.
"""

from ebpf import endpoints
from lab.daemons import Daemon, Proxy, nofile, require

SUFFIX = ".nginx"


def page(name: str, size=512) -> bytes:
    """The served file: says who served it, padded to `size` bytes."""
    head = f"served by {name}\n".encode()
    return head + b"." * max(0, size - len(head) - 1) + b"\n"


def temp_paths(d) -> str:
    """nginx's temporary directories, in the run directory (its defaults are the system's)."""
    return "\n".join(f"    {kind}_temp_path {d}/tmp;" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))


class NginxServer(Daemon):
    suffix = SUFFIX
    what = "nginx"

    def __init__(self, ns, addr, port=8080, cpu=None, body_size=512, name=None, log=True):
        self.binary = require("nginx", "nginx")
        super().__init__(ns, port, port, cpu)
        self.addr, self.log = addr, log
        self.name = name or f"{addr}:{port}"
        self.body = page(self.name, body_size)

    def files(self):
        return {"nginx.conf": self.config(), "www/index.html": self.body, "tmp/.keep": ""}

    def argv(self):
        return [self.binary, "-c", str(self.dir / "nginx.conf"), "-p", str(self.dir), "-e", str(self.dir / "error.log")]

    def config(self) -> str:
        d = self.dir
        return f"""# written by lab.daemons.nginx for one lab run
worker_processes 1;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 16384; }}
worker_rlimit_nofile {nofile()};
http {{
    access_log {f"{d}/access.log" if self.log else "off"};
{temp_paths(d)}
    keepalive_requests 1000000;
    server {{
        listen {endpoints.text(self.addr, self.port)} reuseport backlog=16384;
        root {d}/www;
        location / {{ try_files /index.html =404; }}
    }}
}}
"""

    def requests(self) -> int:
        """Requests served so far (lines of the access log)."""
        try:
            with open(self.dir / "access.log", "rb") as f:
                return sum(1 for _ in f)
        except FileNotFoundError:
            return 0

    def clients(self) -> list[str]:
        """The client address of every request served, in order."""
        try:
            with open(self.dir / "access.log") as f:
                return [line.split(" ", 1)[0] for line in f]
        except FileNotFoundError:
            return []


class NginxProxy(Proxy):
    def __init__(self, ns, name, vip, port, backends, layer):
        self.binary = require("nginx", "nginx")
        super().__init__(ns, name, vip, port, backends)
        self.layer = layer

    def files(self):
        return {"nginx.conf": self.config(), "tmp/.keep": ""}

    def argv(self):
        return [self.binary, "-c", str(self.dir / "nginx.conf"), "-p", str(self.dir), "-e", str(self.dir / "error.log")]

    def config(self):
        d = self.dir
        servers = "".join(f"        server {endpoints.text(a, p)};\n" for a, p in self.backends)
        listen = f"listen {endpoints.text(self.vip, self.port)} reuseport backlog=16384;"
        if self.layer == 4:
            head = "load_module /usr/lib/nginx/modules/ngx_stream_module.so;\n"
            block = f"""stream {{
    upstream backends {{
{servers}    }}
    server {{
        {listen}
        proxy_pass backends;
    }}
}}
"""
        else:
            head = ""
            # HTTP/1.1 and an empty Connection header keep the upstream connections open
            block = f"""http {{
    access_log off;
{temp_paths(d)}
    keepalive_requests 1000000;
    upstream backends {{
{servers}        keepalive 256;
        keepalive_requests 1000000;
    }}
    server {{
        {listen}
        location / {{
            proxy_pass http://backends;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"""
        return f"""# written by lab.daemons.nginx for one lab run
{head}worker_processes 1;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 65536; }}
worker_rlimit_nofile {nofile()};
{block}"""
