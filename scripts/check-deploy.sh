#!/usr/bin/env bash
# Checks the recipes under deploy/ as far as a machine without Docker, Kubernetes or a cluster can:
#   - every JSON, JSON5, YAML and TOML file parses, every Jsonnet file evaluates, every shell script
#     passes `sh -n`;
#   - every dtlto-reapi option named in deploy/ (after a `dtlto-reapi [serve|check|config]` command
#     word, in `-Xthinlto-distributor=`, in an inline code span of options, as a DTLTO_REAPI_*
#     variable, or as a key of a dtlto-reapi TOML file) is one the built binary has;
#   - every port a README names is one the configuration files of its recipe use;
#   - every worker runs at most as many actions at once as its host has cores unless told
#     otherwise: NativeLink's max_inflight_tasks, Buildbarn's runner concurrency and BuildBuddy's
#     EstimatedCPU follow the variable or property the recipe's README names, and every start
#     command sets that variable;
#   - the BuildBuddy credential helper answers `get` with valid JSON, and fails without a key.
# Each problem is one line `check-deploy: FILE: problem`; the exit status is 1 if there was any.
#
# Python packages (PyPI: pyyaml, json5, jsonnet) live in a virtual environment under
# ${XDG_CACHE_HOME:-~/.cache}/dtlto-reapi/deploy-check. DTLTO_REAPI names the binary to compare
# against (default: target/release/dtlto-reapi, which `cargo build --release` makes).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
venv="${XDG_CACHE_HOME:-$HOME/.cache}/dtlto-reapi/deploy-check"
bin="${DTLTO_REAPI:-target/release/dtlto-reapi}"

if [[ ! -x "$bin" ]]; then
    echo "check-deploy: $bin: no dtlto-reapi binary to compare options against (cargo build --release, or set DTLTO_REAPI)" >&2
    exit 1
fi

if ! "$venv/bin/python" -c 'import yaml, json5' 2>/dev/null; then
    echo "check-deploy: installing pyyaml and json5 from PyPI into $venv" >&2
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "pyyaml>=6,<7" "json5==0.17.3" >&2
fi
if ! "$venv/bin/python" -c 'import _jsonnet' 2>/dev/null && ! "$venv/bin/python" -c 'import _gojsonnet' 2>/dev/null; then
    # PyPI's jsonnet (the C++ implementation) ships Linux wheels; gojsonnet (the Go one, same
    # Python interface) is the fallback where it has to be built and cannot be.
    echo "check-deploy: installing jsonnet from PyPI into $venv" >&2
    "$venv/bin/pip" install --quiet --disable-pip-version-check "jsonnet==0.22.0" >&2 ||
        "$venv/bin/pip" install --quiet --disable-pip-version-check "gojsonnet==0.22.0" >&2
fi

exec "$venv/bin/python" - "$bin" <<'PYTHON'
import json, os, re, subprocess, sys, tempfile, tomllib
from pathlib import Path

import json5, yaml
try:
    import _jsonnet as jsonnet
    jsonnet_impl = "jsonnet (C++)"
except ImportError:
    import _gojsonnet as jsonnet
    jsonnet_impl = "gojsonnet (Go)"

BIN = sys.argv[1]
DEPLOY = Path("deploy")
problems = []


def problem(path, what):
    problems.append(f"check-deploy: {path}: {what}")


# ---------------------------------------------------------------------------------------------
# The options dtlto-reapi has, per scope.

def run_help(*args):
    return subprocess.run([BIN, *args, "--help"], capture_output=True, text=True, check=True).stdout


def help_options(text):
    opts = set()
    for line in text.splitlines():
        m = re.match(r"^\s+(?:-[A-Za-z], )?(--[a-z0-9][a-z0-9-]*)", line)
        if m:
            opts.add(m.group(1))
    return opts


main_help = run_help()
known = {"link": help_options(main_help)}
known["config"] = known["link"]
known["serve"] = help_options(run_help("serve"))
known["check"] = help_options(run_help("check"))


def check_option(path, scope, opt):
    if opt in ("--help", "-h", "--version", "-V"):
        return
    if opt in known[scope]:
        return
    where = "dtlto-reapi" if scope == "link" else f"dtlto-reapi {scope}"
    problem(path, f"{opt} is not an option of {where}")


def options_in(text):
    return re.findall(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)", text)


# ---------------------------------------------------------------------------------------------
# Option mentions in text (README, YAML, TOML, shell).

COMMAND = re.compile(r"(?:^|(?<=[\s/\"'(`$=]))dtlto-reapi[\"']?(?:\s+(serve|check|config)\b)?(?=\s|$|`)")
STOP = re.compile(r"\s(?:\||&&|\|\||;|&|>|#)|[`)]|$")


def logical_lines(text):
    return re.sub(r"\\\n\s*", " ", text).splitlines()


def scan_text(path, text):
    for line in logical_lines(text):
        for m in COMMAND.finditer(line):
            scope = m.group(1) or "link"
            rest = line[m.end():]
            rest = rest[: STOP.search(rest).start()]
            for tok in rest.split():
                tok = tok.strip("\"'")
                if tok.startswith("--"):
                    check_option(path, scope, re.match(r"--[a-z0-9-]*", tok).group(0))
        for opt in re.findall(r"(?:-Xthinlto-distributor=|--thinlto-distributor-arg=)(--[a-z0-9][a-z0-9-]*)", line):
            check_option(path, "link", opt)
    for var in re.findall(r"\bDTLTO_REAPI_([A-Z0-9_]+)\b", text):
        check_option(path, "link", "--" + var.lower().replace("_", "-"))


def scan_markdown(path, text):
    scan_text(path, text)
    # Inline code spans made of options only: `--mode=cache-only --remote-upload=false`,
    # or of a subcommand and its options: `serve --cas-dir`.
    for span in re.findall(r"(?<!`)`([^`\n]+(?:\n[^`\n]+)?)`(?!`)", text):
        span = span.strip()
        m = re.match(r"^(serve|check|config)\s+(--.*)$", span, re.S)
        if m:
            for opt in options_in(m.group(2)):
                check_option(path, m.group(1), opt)
        elif span.startswith("--"):
            for opt in options_in(span):
                check_option(path, "link", opt)
    # TOML code blocks: they must parse, and their keys are options.
    for block in re.findall(r"```toml\n(.*?)```", text, re.S):
        check_toml(path, block)


def check_toml(path, text):
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        problem(path, f"TOML does not parse: {e}")
        return None
    for key in data:
        check_option(path, "link", "--" + key)
    # Commented-out settings are instructions too.
    for key in re.findall(r"^#\s*([a-z][a-z0-9-]*)\s*=", text, re.M):
        check_option(path, "link", "--" + key)
    return data


# ---------------------------------------------------------------------------------------------
# Parse every file.

parsed = {}  # path -> parsed data (configuration files only)
# The variables that set how many actions a worker runs at once, with a value to recognise: a bound
# that follows its variable comes out as BOUND after parsing.
BOUND = 7
EXT_VARS = {"BB_WORKER_CONCURRENCY": str(BOUND)}
counts = {}


def count(kind):
    counts[kind] = counts.get(kind, 0) + 1


for path in sorted(p for p in DEPLOY.rglob("*") if p.is_file()):
    text = path.read_text()
    suffix = path.suffix
    try:
        if suffix == ".json":
            parsed[path] = json.loads(text)
        elif suffix == ".json5":
            parsed[path] = json5.loads(text)
        elif suffix in (".yml", ".yaml"):
            docs = [d for d in yaml.safe_load_all(text) if d is not None]
            if not docs:
                problem(path, "YAML file holds no document")
            parsed[path] = docs
            scan_text(path, text)
        elif suffix in (".jsonnet", ".libsonnet"):
            parsed[path] = json.loads(jsonnet.evaluate_file(str(path), ext_vars=EXT_VARS))
        elif suffix == ".toml":
            data = check_toml(path, text)
            if data is not None:
                parsed[path] = data
            scan_text(path, text)
        elif suffix == ".md":
            scan_markdown(path, text)
        elif suffix == ".sh":
            r = subprocess.run(["sh", "-n", str(path)], capture_output=True, text=True)
            if r.returncode != 0:
                problem(path, "shell syntax: " + r.stderr.strip().replace("\n", " "))
            if not os.access(path, os.X_OK):
                problem(path, "shell script is not executable")
            scan_text(path, text)
        else:
            problem(path, f"unexpected file type {suffix or '(none)'}: teach scripts/check-deploy.sh to check it")
            continue
        count(suffix)
    except Exception as e:  # a parser's own message names line and column
        msg = str(e).replace("\n", " ")
        kind = {".jsonnet": "Jsonnet does not evaluate", ".libsonnet": "Jsonnet does not evaluate"}.get(
            suffix, f"{suffix[1:].upper()} does not parse")
        problem(path, f"{kind}: {msg}")


# ---------------------------------------------------------------------------------------------
# Ports: each README's ports must be used by the configuration of its recipe (its own directory
# and the recipe directories it links to).

def ports_in_data(data, key=""):
    found = set()
    if isinstance(data, dict):
        for k, v in data.items():
            found |= ports_in_data(v, str(k))
    elif isinstance(data, list):
        for v in data:
            found |= ports_in_data(v, key)
    elif isinstance(data, bool):
        pass
    elif isinstance(data, int):
        if re.search(r"port|expose", key, re.I):
            found.add(data)
    elif isinstance(data, str):
        found |= {int(p) for p in re.findall(r"(?<=[\w\]}]):(\d{2,5})(?![\w.])", data)}
        if re.search(r"port|expose", key, re.I):
            found |= {int(p) for p in re.findall(r"^(\d{2,5})(?:/tcp|/udp)?$", data)}
    return found


def ports_in_readme(text):
    found = set(int(p) for p in re.findall(r"(?<=[\w\]}]):(\d{3,5})(?![\w.])", text))
    # Sentences that speak of ports: "on ports 50051 (CAS) and 50061 (worker API)".
    for sentence in re.split(r"\.\s|\n\s*\n", text):
        if re.search(r"\bports?\b", sentence, re.I):
            found |= {int(p) for p in re.findall(r"(?<![\w.:/-])(\d{4,5})(?![\w.])", sentence)}
    # Markdown tables with a "port" column: every 4-5 digit number in that column.
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("|") or i + 1 >= len(lines) or not re.match(r"^\|[\s:|-]+\|$", lines[i + 1]):
            continue
        header = [c.strip().lower() for c in line.strip("|").split("|")]
        cols = [j for j, c in enumerate(header) if "port" in c]
        for row in lines[i + 2:]:
            if not row.startswith("|"):
                break
            cells = row.strip("|").split("|")
            for j in cols:
                if j < len(cells):
                    found |= {int(p) for p in re.findall(r"(?<![\w.])(\d{4,5})(?![\w.])", cells[j])}
    return {p for p in found if 80 <= p <= 65535}


ports_checked = 0
for readme in sorted(DEPLOY.rglob("README.md")):
    text = readme.read_text()
    dirs = {readme.parent.resolve()}
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        d = (readme.parent / target).resolve()
        if d.is_dir() and DEPLOY.resolve() in (d, *d.parents):
            dirs.add(d)
    used = set()
    for path, data in parsed.items():
        if path.resolve().parent in dirs or any(d in path.resolve().parents for d in dirs if d != DEPLOY.resolve()):
            used |= ports_in_data(data)
    for port in sorted(ports_in_readme(text)):
        ports_checked += 1
        if port not in used:
            problem(readme, f"names port {port}, which no configuration file of this recipe uses")


# ---------------------------------------------------------------------------------------------
# Actions at once per worker. One ThinLTO backend compile keeps one core busy: a worker without a
# bound starts every action it is given (NativeLink's default: a 2-core host ran ~190 compiles of
# one link at once). Each bound must follow the knob its README names, and every command that
# starts the worker must set it.

def expand_env(text, env):
    # NativeLink's shellexpand: ${VAR} and ${VAR:-default}; an unset variable without a default
    # is an error (None here).
    def one(m):
        value = env.get(m.group(1), m.group(3))
        if value is None:
            raise KeyError(m.group(1))
        return value
    try:
        return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:-([^}]*))?\}", one, text)
    except KeyError:
        return None


def readme_names(readme, knob, what):
    if not readme.exists() or f"`{knob}`" not in readme.read_text():
        problem(readme, f"does not name `{knob}`, which bounds the actions a {what} runs at once")


def start_commands(pattern):
    # Logical lines of every README and configuration comment that run a worker.
    for path in sorted(DEPLOY.rglob("*")):
        if path.is_file() and path.suffix in (".md", ".json5", ".yml", ".yaml", ".jsonnet"):
            text = re.sub(r"\\\n\s*(//\s*)?", " ", path.read_text())
            for line in text.splitlines():
                if re.search(pattern, line):
                    yield path, line


bounds_checked = 0
NL_VAR = "NATIVELINK_MAX_INFLIGHT_TASKS"
for path, data in sorted(parsed.items()):
    if path.suffix != ".json5" or not isinstance(data, dict):
        continue
    for worker in data.get("workers") or []:
        local = worker.get("local", {}) if isinstance(worker, dict) else {}
        bounds_checked += 1
        bound = local.get("max_inflight_tasks", 0)
        if isinstance(bound, str):
            bound = expand_env(bound, {NL_VAR: str(BOUND)})
            bound = int(bound) if bound and bound.isdigit() else None
        if not isinstance(bound, int) or bound <= 0:
            problem(path, f"a NativeLink worker without a positive max_inflight_tasks starts every action it is given at once")
        readme_names(path.parent / "README.md", "max_inflight_tasks", "NativeLink worker")
        uses_var = NL_VAR in json.dumps(local.get("max_inflight_tasks", ""))
        if uses_var:
            for where, line in start_commands(r"\bnativelink\s+\S*" + re.escape(path.name)):
                if f"{NL_VAR}=" not in line:
                    problem(where, f"starts {path.name} without {NL_VAR}=")
            # Pods that run it (the ConfigMap holds the same file) must set the variable.
            for yml, docs in parsed.items():
                if yml.suffix not in (".yml", ".yaml"):
                    continue
                for doc in docs:
                    spec = (((doc or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
                    for c in spec.get("containers") or []:
                        if any(path.name in str(a) for a in c.get("args") or []):
                            names = {e.get("name") for e in c.get("env") or []}
                            if NL_VAR not in names:
                                problem(yml, f"container {c.get('name')} runs {path.name} without {NL_VAR}")

for path, data in sorted(parsed.items()):
    if path.suffix != ".jsonnet" or not isinstance(data, dict):
        continue
    for build_dir in data.get("buildDirectories") or []:
        for runner in build_dir.get("runners") or []:
            bounds_checked += 1
            if runner.get("concurrency") != BOUND:
                problem(path, f"runner concurrency is {runner.get('concurrency')!r}, not BB_WORKER_CONCURRENCY: it must follow the variable the README names")
            readme_names(path.parent.parent / "README.md", "concurrency", "Buildbarn worker")
            compose = path.parent.parent / "docker-compose.yml"
            if compose in parsed:
                services = parsed[compose][0].get("services", {})
                runs = [s for s in services.values() if any(path.name in str(a) for a in s.get("command") or [])]
                for service in runs:
                    value = str((service.get("environment") or {}).get("BB_WORKER_CONCURRENCY", ""))
                    if not value.startswith("${BB_WORKER_CONCURRENCY:?"):
                        problem(compose, "the worker must get BB_WORKER_CONCURRENCY, required (${BB_WORKER_CONCURRENCY:?...})")
                for where, line in start_commands(r"docker compose up"):
                    if where.parent == compose.parent and "BB_WORKER_CONCURRENCY=" not in line:
                        problem(where, "starts the cluster without BB_WORKER_CONCURRENCY=")

for path, data in sorted(parsed.items()):
    if path.parent.name != "buildbuddy":
        continue
    if path.suffix == ".yaml" and isinstance(data, list) and data and "executor" in data[0]:
        bounds_checked += 1
        millicpu = data[0]["executor"].get("millicpu", 0)
        if not isinstance(millicpu, int) or millicpu < 0:
            problem(path, f"executor millicpu {millicpu!r} is not a number of thousandths of a core")
        readme_names(path.parent / "README.md", "millicpu", "BuildBuddy executor")
    if path.suffix == ".toml":
        text = path.read_text()
        lines = [data.get("platform", [])] + [
            tomllib.loads(m)["platform"] for m in re.findall(r"^#\s*(platform\s*=.*)$", text, re.M)]
        for platform in lines:
            bounds_checked += 1
            if "EstimatedCPU=1" not in platform:
                problem(path, f"platform {platform} lacks EstimatedCPU=1: BuildBuddy reserves 0.6 core per action without it")
        readme_names(path.parent / "README.md", "EstimatedCPU", "BuildBuddy executor")

# ---------------------------------------------------------------------------------------------
# The BuildBuddy credential helper speaks the protocol.

helper = DEPLOY / "buildbuddy" / "credential-helper.sh"
if helper.exists():
    with tempfile.TemporaryDirectory() as home:
        env = {"PATH": os.environ["PATH"], "HOME": home, "BUILDBUDDY_API_KEY": "test_key-123"}
        r = subprocess.run([str(helper), "get"], input='{"uri": "grpcs://remote.buildbuddy.io"}',
                           capture_output=True, text=True, env=env, timeout=10)
        try:
            answer = json.loads(r.stdout)
            ok = r.returncode == 0 and answer["headers"]["x-buildbuddy-api-key"] == ["test_key-123"]
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            problem(helper, f"`get` with BUILDBUDDY_API_KEY set did not answer the header (exit {r.returncode}, stdout {r.stdout.strip()!r})")
        del env["BUILDBUDDY_API_KEY"]
        r = subprocess.run([str(helper), "get"], input="{}", capture_output=True, text=True, env=env, timeout=10)
        if r.returncode == 0 or not r.stderr.strip() or r.stdout.strip():
            problem(helper, "`get` without a key must fail with a message on stderr and nothing on stdout")

# ---------------------------------------------------------------------------------------------

problems = list(dict.fromkeys(problems))
for line in problems:
    print(line, file=sys.stderr)
summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
print(f"check-deploy: {summary} files checked ({jsonnet_impl}); {ports_checked} README ports; "
      f"{bounds_checked} worker concurrency bounds; "
      f"{len(problems)} problem{'s' if len(problems) != 1 else ''}")
sys.exit(1 if problems else 0)
PYTHON
