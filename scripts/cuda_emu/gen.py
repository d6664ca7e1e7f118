# Rewrites every src/backend/cuda/*.cu into gen/*.cpp (launches -> emu::launch) and
# builds fake_runtime.cpp from runtime.cpp's hooks. MUT env: "file|old|new" mutation.
import re, glob, os, sys
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get('KESTREL_ROOT', os.path.abspath(os.path.join(HERE, '..', '..')))
EMU = os.environ.get('EMU_BUILD', os.path.join(ROOT, 'build', 'cuda_emu'))
SRC = os.path.join(ROOT, 'src', 'backend', 'cuda')
OUT = os.path.join(EMU, 'gen')
os.makedirs(OUT, exist_ok=True)
pat = re.compile(r'([A-Za-z_]\w*(?:<[^<>;()]*>)?)<<<(.*?), (.*?), 0, (.*?)>>>\(')
muts = [m.split('|') for m in os.environ.get('MUT', '').split('@@') if m]
def mutate(name, s):
    for f, old, new in muts:
        if f == name:
            assert s.count(old) == 1, 'mutation pattern must occur once in %s: %r (found %d)' % (f, old, s.count(old))
            s = s.replace(old, new)
            print('mutated', f, ':', old, '->', new)
    return s
for path in sorted(glob.glob(SRC + '/*.cu')):
    name = os.path.basename(path)
    s = mutate(name, open(path).read())
    n = [0]
    def rep(m):
        n[0] += 1
        return 'emu::launch("%s:%s", %s, %s, [&](auto&&... a_) { %s(a_...); }, ' % (name, m.group(1), m.group(2), m.group(3), m.group(1))
    s = pat.sub(rep, s)
    # shared memory is uninitialised at block start: the first thread of each block to reach
    # the declaration fills it with 0xFF (the emulator keeps __shared__ as function statics).
    s, ns = re.subn(r'(__shared__\s+[\w:]+\s+(\w+)(?:\[[^\];]*\])+;)', r'\1 emu::shared_poison(\2, sizeof(\2));', s)
    assert '<<<' not in s, name
    out = OUT + '/' + name[:-3] + '.emu.cpp'
    if not os.path.exists(out) or open(out).read() != s:
        open(out, 'w').write(s)
    print('%-22s launches rewritten: %d, shared arrays: %d' % (name, n[0], ns))
for path in sorted(glob.glob(SRC + '/*.cpp')):
    name = os.path.basename(path)
    if name == 'runtime.cpp': continue
    s = mutate(name, open(path).read())
    out = OUT + '/' + name[:-4] + '.host.cpp'
    if not os.path.exists(out) or open(out).read() != s:
        open(out, 'w').write(s)
rt = open(SRC + '/runtime.cpp').read()
hooks = rt[rt.index('uint64_t encode('):rt.index('}  // namespace\n\nbool available()')]
fk = rt[rt.index('launch::FloatKind float_kind('):]
fk = fk[:fk.index('\n}\n') + 3]
t = open(os.path.join(HERE, 'fake_runtime.tmpl.cpp')).read().replace('//@@HOOKS@@', hooks).replace('//@@FLOAT_KIND@@', fk)
out = OUT + '/fake_runtime.cpp'
if not os.path.exists(out) or open(out).read() != t:
    open(out, 'w').write(t)
