"""The import graph of zbd-core's top-level modules (from their `crate::` paths), and its cycles.

Usage: python3 scripts/modgraph.py [crates/zbd-core/src]; exits 1 when a cycle exists (a lower room
that imports an upper one). `make check` runs it.
"""

import os
import re
import sys

TEST_MODULE = re.compile(r"#\[cfg\(test\)\]\s*(?:pub(?:\(crate\))? )?mod ([a-z_]+);")


def test_only(root: str) -> set[str]:
    """Files of modules declared `#[cfg(test)] mod name;`: test helpers, not rooms' imports."""
    found = set()
    for dirpath, _, files in os.walk(root):
        for name in files:
            if name in ("mod.rs", "lib.rs"):
                with open(os.path.join(dirpath, name)) as f:
                    for m in TEST_MODULE.findall(f.read()):
                        found.add(os.path.join(dirpath, m + ".rs"))
    return found


def graph(root: str) -> dict[str, set[str]]:
    mods: dict[str, set[str]] = {}
    skip = test_only(root)
    for dirpath, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".rs"):
                continue
            path = os.path.join(dirpath, name)
            if path in skip:
                continue
            top = os.path.relpath(path, root).split("/")[0].removesuffix(".rs")
            if top == "lib":
                continue
            with open(path) as f:
                text = re.split(r"#\[cfg\(test\)\]\s*mod tests \{", f.read())[0]
            mods.setdefault(top, set()).update(
                set(re.findall(r"crate::([a-z_]+)", text)) - {top}
            )
    return {m: {d for d in deps if d in mods} for m, deps in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


if __name__ == "__main__":
    g = graph(sys.argv[1] if len(sys.argv) > 1 else "crates/zbd-core/src")
    for m in sorted(g):
        print(f"{m:10} -> {', '.join(sorted(g[m]))}")
    found = cycles(g)
    print("cycles:", found or "none")
    sys.exit(1 if found else 0)
