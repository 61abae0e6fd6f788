#!/usr/bin/env python3
"""The source tree's layering, checked from its #include lines and the names it uses.

    check_layers.py SOURCE_DIR

- Each directory under src/ is a layer, and so is each backend's folder under src/backends/
  (backends/redis, backends/quorum, backends/etcd; backends itself holds the registry). The layers
  include each other without a cycle.
- The seam: outside src/backends/ and src/fence/ (the guards, one of which keeps its mark in Redis), no
  file includes a backend's header or names a backend's code: no `redis::`, `etcd::` or `quorum::`,
  no Redis*/Etcd*/Quorum* type (comments and strings aside). src/lease/ is the seam itself and names
  none either.
- A backend includes no other backend, except that a quorum is built of Redis servers
  (backends/quorum may include backends/redis).
- src/net/ (the byte streams: TCP, unix socket, TLS) is neutral: any backend may use it, and it
  includes nothing but src/util/ (no backend, not the seam).
- hiredis is included only under src/backends/redis/, spdlog only in src/log/log.cpp, Boost.Beast and
  the JSON library only in src/backends/etcd/client.cpp (the etcd client); OpenSSL only under
  src/net/; libcurl nowhere.
- No signal handler is installed anywhere (signals are read from a signalfd): the command's vfork
  child, which shares fencerun's memory, relies on it (src/supervisor/spawn.cpp).
Exit 0 when all hold; otherwise prints each violation and exits 1.
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)
ONLY_IN = [
    (re.compile(r"^hiredis/"), lambda f: f.startswith("backends/redis/"), "hiredis outside src/backends/redis/"),
    (re.compile(r"^spdlog/"), lambda f: f == "log/log.cpp", "spdlog outside src/log/log.cpp"),
    (re.compile(r"^curl/"), lambda f: False, "libcurl (the etcd client speaks HTTP/1.1 itself)"),
    (re.compile(r"^boost/"), lambda f: f == "backends/etcd/client.cpp", "Boost outside src/backends/etcd/client.cpp"),
    (re.compile(r"^openssl/"), lambda f: f.startswith("net/"), "OpenSSL outside src/net/"),
    (re.compile(r"^nlohmann/"), lambda f: f == "backends/etcd/client.cpp",
     "the JSON library outside src/backends/etcd/client.cpp"),
]
# A handler: sa_handler set to anything but SIG_DFL/SIG_IGN, sa_sigaction, or signal(2)/sigset(3).
HANDLER = re.compile(r"\bsa_handler\s*=(?!=)\s*(?![\s=])(?!SIG_DFL\b|SIG_IGN\b)|\bsa_sigaction\b|(?<![\w:.>])(?:::)?(?:signal|sigset)\s*\(\s*SIG")
# A backend named in code: its namespace or one of its types.
BACKEND_NAME = re.compile(r"\b(?:redis|etcd|quorum)::|\b(?:Redis|Etcd|Quorum)[A-Z]\w*")
# Comments and string or character literals, blanked before BACKEND_NAME looks (line breaks kept).
NOT_CODE = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
BACKENDS_ALLOWED = {("backends/quorum", "backends/redis")}
# Neutral layers and the only layers each may include.
NEUTRAL_INCLUDES = {"net": {"util"}}


def layer_of(rel):
    """The layer of a path relative to src/: 'app', 'backends/redis', 'backends' (the registry), ..."""
    parts = rel.split("/")
    if parts[0] == "backends" and len(parts) > 2:
        return "backends/" + parts[1]
    return parts[0] if len(parts) > 1 else None


def main():
    src = os.path.join(sys.argv[1], "src")
    layers = set()
    edges = {}
    problems = []
    files = []
    for root, _, names in os.walk(src):
        for name in names:
            if name.endswith((".cpp", ".hpp", ".h", ".c")):
                files.append(os.path.relpath(os.path.join(root, name), src).replace(os.sep, "/"))
    for rel in files:
        here = layer_of(rel)
        if here:
            layers.add(here)
            edges.setdefault(here, set())
    for rel in sorted(files):
        here = layer_of(rel)
        with open(os.path.join(src, rel), encoding="utf-8") as f:
            text = f.read()
        for m in HANDLER.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            problems.append("%s:%d: installs a signal handler (fencerun reads signals from a signalfd)" % (rel, line))
        outside_backends = not rel.startswith("backends/") and not rel.startswith("fence/")
        if outside_backends:
            code = NOT_CODE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
            for m in BACKEND_NAME.finditer(code):
                line = code.count("\n", 0, m.start()) + 1
                problems.append("%s:%d: names a backend (%s) outside src/backends/" % (rel, line, m.group(0)))
        for inc in INCLUDE.findall(text):
            for pattern, allowed, why in ONLY_IN:
                if pattern.search(inc) and not allowed(rel):
                    problems.append("%s: #include <%s>: %s" % (rel, inc, why))
            if inc.startswith("backends/") and outside_backends:
                problems.append("%s: #include <%s>: a backend's header outside src/backends/ and src/fence/" % (rel, inc))
            target = layer_of(inc)
            if not here or target not in layers or target == here:
                continue
            if (here.startswith("backends/") and target.startswith("backends/")
                    and (here, target) not in BACKENDS_ALLOWED):
                problems.append("%s: #include <%s>: one backend includes another" % (rel, inc))
            if here in NEUTRAL_INCLUDES and target not in NEUTRAL_INCLUDES[here]:
                problems.append("%s: #include <%s>: %s/ includes only %s" % (
                    rel, inc, here, ", ".join(sorted(NEUTRAL_INCLUDES[here]))))
            edges[here].add(target)
    # A cycle between layers: depth-first search with colours.
    colour = {d: 0 for d in layers}
    path = []

    def visit(d):
        colour[d] = 1
        path.append(d)
        for e in sorted(edges[d]):
            if colour[e] == 1:
                problems.append("include cycle: " + " -> ".join(path[path.index(e):] + [e]))
            elif colour[e] == 0:
                visit(e)
        path.pop()
        colour[d] = 2

    for d in sorted(layers):
        if colour[d] == 0:
            visit(d)
    for p in problems:
        print(p)
    if not problems:
        for d in sorted(layers):
            print("%-16s -> %s" % (d, " ".join(sorted(edges[d])) or "(nothing)"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
