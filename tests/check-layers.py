#!/usr/bin/env python3
"""Layering gate of CI: no circle of calls between the files of one module.

A C file depends on another file of its directory when it calls a function
that the other defines without `static`; a Python module of the convgrad
package depends on another when it imports it (at the top or inside a
function: a late import is still a circle). Each directory must form a graph
without cycles, so that a reader can take its files in an order where each
uses only those read before (the "Source layout" sections of server/,
client/ and kernels/README.md). Issue 35 broke two such circles; this keeps
them broken.

Usage: tests/check-layers.py [--graph]   (--graph prints each file's edges)
Exit 0 when no directory has a cycle, 1 (naming the cycle) otherwise.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
C_DIRS = ["client/src", "server", "kernels/src", "proto"]
PY_PACKAGE = "client/python/convgrad"

# Comments, string and character literals, matched in one pass so that a
# "//" inside a string or a quote inside a comment is taken for what it is.
C_NOISE = re.compile(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'',
                     re.S)
# A function definition at the start of a line that is not static: its
# return type, its name, its parameters, then the body's brace.
C_EXTERN_DEF = re.compile(
    r"^(?!static\b)(?!typedef\b)[A-Za-z_][\w \t*]*?\b([A-Za-z_]\w*)\s*\([^;{)]*\)\s*\{",
    re.M)
C_STATIC_DEF = re.compile(
    r"^static\b[\w \t*]*?\b([A-Za-z_]\w*)\s*\([^;{)]*\)\s*\{", re.M)
C_CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
PY_IMPORT = re.compile(r"^\s*from \.(\w*) import ([\w, ()\n]+?)(?:#|$)", re.M)


def c_graph(directory):
    """Maps each .c file of directory to the set of files it calls into."""
    texts, owner, local = {}, {}, {}
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".c"):
            continue
        with open(os.path.join(directory, name), encoding="utf-8") as f:
            text = C_NOISE.sub(lambda m: " " if m.group(0)[0] == "/" else '""',
                               f.read())
        texts[name] = text
        for m in C_EXTERN_DEF.finditer(text):
            owner.setdefault(m.group(1), name)
        # A static function shadows an extern one of the same name elsewhere.
        local[name] = set(C_STATIC_DEF.findall(text))
    return {name: {owner[c] for c in C_CALL.findall(text)
                   if c in owner and owner[c] != name and c not in local[name]}
            for name, text in texts.items()}


def py_graph(directory):
    """Maps each module of the package to the set of its modules it imports."""
    names = sorted(n for n in os.listdir(directory) if n.endswith(".py"))
    modules = {n[:-3] for n in names}
    graph = {}
    for name in names:
        with open(os.path.join(directory, name), encoding="utf-8") as f:
            text = f.read()
        deps = set()
        for m in PY_IMPORT.finditer(text):
            if m.group(1):  # from .mod import x
                deps.add(m.group(1))
            else:  # from . import mod [as x], ...
                for part in m.group(2).replace("(", " ").replace(")", " ").split(","):
                    word = part.split()
                    if word and word[0] in modules:
                        deps.add(word[0])
        graph[name[:-3]] = {d for d in deps if d in modules and d != name[:-3]}
    return graph


def find_cycle(graph):
    """A list of nodes forming a cycle in graph, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def main():
    show = "--graph" in sys.argv[1:]
    graphs = [(d, c_graph(os.path.join(ROOT, d))) for d in C_DIRS]
    graphs.append((PY_PACKAGE, py_graph(os.path.join(ROOT, PY_PACKAGE))))
    failed = 0
    for directory, graph in graphs:
        cycle = find_cycle(graph)
        edges = sum(len(v) for v in graph.values())
        print("== layers: %s: %d files, %d edges, %s" %
              (directory, len(graph), edges,
               "cycle " + " -> ".join(cycle) if cycle else "no cycle"))
        if show:
            for node in sorted(graph):
                print("   %-18s -> %s" % (node, ", ".join(sorted(graph[node])) or "-"))
        failed |= cycle is not None
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
