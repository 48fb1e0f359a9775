import ast, sys, pathlib, itertools
root = pathlib.Path(sys.argv[1])
mods = {}
for p in sorted(root.glob('train/**/*.py')) + sorted(root.glob('launch/**/*.py')):
    rel = p.relative_to(root).with_suffix('')
    parts = list(rel.parts)
    if parts[-1] == '__init__': parts = parts[:-1]
    mods['.'.join(parts)] = p
def resolve(name):
    while name and name not in mods:
        name = name.rpartition('.')[0]
    return name or None
edges = {m: set() for m in mods}
for m, p in mods.items():
    tree = ast.parse(p.read_text())
    pkg = m if p.name == '__init__.py' else m.rpartition('.')[0]
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            for a in n.names:
                t = resolve(a.name)
                if t and t != m: edges[m].add(t)
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ''
            if n.level:
                b = pkg.split('.')
                b = b[:len(b)-(n.level-1)]
                base = '.'.join(b + ([base] if base else []))
            for a in n.names:
                t = resolve(base + '.' + a.name) if base + '.' + a.name in mods else resolve(base)
                if t and t != m: edges[m].add(t)
# SCCs
idx = {}; low = {}; st = []; on = set(); out = []; c = [0]
sys.setrecursionlimit(10000)
def sc(v):
    idx[v] = low[v] = c[0]; c[0] += 1; st.append(v); on.add(v)
    for w in edges[v]:
        if w not in idx: sc(w); low[v] = min(low[v], low[w])
        elif w in on: low[v] = min(low[v], idx[w])
    if low[v] == idx[v]:
        comp = []
        while True:
            w = st.pop(); on.discard(w); comp.append(w)
            if w == v: break
        if len(comp) > 1: out.append(comp)
for v in mods:
    if v not in idx: sc(v)
for comp in out: print('CYCLE', sorted(comp))
# long files/functions
for m, p in mods.items():
    src = p.read_text(); n = src.count('\n')
    if n > 450: print('FILE', p, n)
    for f in ast.walk(ast.parse(src)):
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
            L = f.end_lineno - f.lineno + 1
            if L > 60: print('FUNC', p, f.name, L)
