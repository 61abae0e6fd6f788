#!/usr/bin/env python3
"""The source tree's layering, checked from its #include lines.

    check_layers.py SOURCE_DIR

- The directories under src/ include each other without a cycle (each is one layer).
- hiredis is included only under src/redis/, CLI11 only in src/cli/parse.cpp, Boost.Process only in
  src/supervisor/spawn.cpp, spdlog only in src/log/log.cpp, libcurl and the JSON library only in
  src/etcd/client.cpp (the etcd client, loaded only for etcd URLs), and src/supervisor/ knows nothing of Redis
  (no redis/ include).
- No signal handler is installed anywhere (signals are read from a signalfd): the command's vfork
  child, which shares fencerun's memory, relies on it (src/supervisor/spawn.cpp).
Exit 0 when all hold; otherwise prints each violation and exits 1.
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)
ONLY_IN = [
    (re.compile(r"^hiredis/"), lambda f: f.startswith("redis/"), "hiredis outside src/redis/"),
    (re.compile(r"^CLI/"), lambda f: f == "cli/parse.cpp", "CLI11 outside src/cli/parse.cpp"),
    (re.compile(r"^boost/process"), lambda f: f == "supervisor/spawn.cpp", "Boost.Process outside src/supervisor/spawn.cpp"),
    (re.compile(r"^spdlog/"), lambda f: f == "log/log.cpp", "spdlog outside src/log/log.cpp"),
    (re.compile(r"^curl/"), lambda f: f == "etcd/client.cpp", "libcurl outside src/etcd/client.cpp"),
    (re.compile(r"^nlohmann/"), lambda f: f == "etcd/client.cpp", "the JSON library outside src/etcd/client.cpp"),
    (re.compile(r"^redis/"), lambda f: not f.startswith("supervisor/"), "src/supervisor/ includes the Redis layer"),
]
# A handler: sa_handler set to anything but SIG_DFL/SIG_IGN, sa_sigaction, or signal(2)/sigset(3).
HANDLER = re.compile(r"\bsa_handler\s*=(?!=)\s*(?![\s=])(?!SIG_DFL\b|SIG_IGN\b)|\bsa_sigaction\b|(?<![\w:.>])(?:::)?(?:signal|sigset)\s*\(\s*SIG")


def main():
    src = os.path.join(sys.argv[1], "src")
    layers = {d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d))}
    edges = {d: set() for d in layers}
    problems = []
    for root, _, files in os.walk(src):
        for name in files:
            if not name.endswith((".cpp", ".hpp", ".h", ".c")):
                continue
            rel = os.path.relpath(os.path.join(root, name), src)
            here = rel.split(os.sep)[0] if os.sep in rel else None
            with open(os.path.join(root, name), encoding="utf-8") as f:
                text = f.read()
            for m in HANDLER.finditer(text):
                line = text.count("\n", 0, m.start()) + 1
                problems.append("%s:%d: installs a signal handler (fencerun reads signals from a signalfd)" % (rel, line))
            for inc in INCLUDE.findall(text):
                for pattern, allowed, why in ONLY_IN:
                    if pattern.search(inc) and not allowed(rel):
                        problems.append("%s: #include <%s>: %s" % (rel, inc, why))
                top = inc.split("/")[0]
                if here and top in layers and top != here:
                    edges[here].add(top)
    # A cycle between directories: depth-first search with colours.
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
            print("%-10s -> %s" % (d, " ".join(sorted(edges[d])) or "(nothing)"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
