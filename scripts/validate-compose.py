"""Checks what `docker-compose config` does not: that compose.yaml and the Dockerfiles it
builds only reference files that exist and reach the image. Run by scripts/validate-compose.sh
(with the docker-compose venv's Python: PyYAML and docker-py's .dockerignore matcher).

    python validate-compose.py RESOLVED.yaml REPO

RESOLVED.yaml is the output of `docker-compose -f compose.yaml config` (absolute paths).
Checked, for every service:
  - a build context that is a directory inside the repository, and its Dockerfile;
  - in each Dockerfile: every COPY/ADD source exists in the context and is not excluded by
    .dockerignore; COPY --from names an earlier stage;
  - the absolute paths the image runs (exec-form ENTRYPOINT, and healthcheck commands in
    compose.yaml) were COPYed into the image, from a file that is executable;
  - bind mounts: the source exists inside the repository;
  - profiles: what a service depends on starts whenever the service does;
and for an image that runs `cargo build`: every file the crate embeds at compile time
(include_str!, include_bytes!, sqlx::migrate!, outside test-only code) is inside the context,
not excluded, and copied into the build stage. Finally, every Dockerfile in the repository
is used by some service. Exits 1 with one line per problem.
"""

import fnmatch
import json
import glob
import os
import re
import sys

import yaml
from docker.utils.build import exclude_paths

problems = []


def problem(msg):
    problems.append(msg)


def inside(path, root):
    path, root = os.path.realpath(path), os.path.realpath(root)
    return path == root or path.startswith(root + os.sep)


def dockerignore(context):
    # As docker-py (docker-compose v1) reads it.
    f = os.path.join(context, ".dockerignore")
    if not os.path.exists(f):
        return []
    with open(f) as fh:
        lines = [line.strip() for line in fh.read().splitlines()]
    return [x for x in lines if x and not x.startswith("#")]


def instructions(path):
    """(line number, INSTRUCTION, arguments) of a Dockerfile, continuations joined."""
    out, buf, start = [], "", 0
    with open(path) as fh:
        for n, raw in enumerate(fh, 1):
            line = raw.rstrip("\n")
            if not buf and (not line.strip() or line.lstrip().startswith("#")):
                continue
            if buf and line.lstrip().startswith("#"):
                continue  # comment lines inside a continuation are dropped
            if not buf:
                start = n
            if line.endswith("\\"):
                buf += line[:-1] + " "
                continue
            buf += line
            word, _, rest = buf.strip().partition(" ")
            out.append((start, word.upper(), rest.strip()))
            buf = ""
    return out


def split_args(rest):
    """Flags (--x=y) and the remaining words; the JSON form too."""
    flags, words = {}, []
    if rest.startswith("["):
        return flags, json.loads(rest)
    for w in rest.split():
        if not words and w.startswith("--"):
            k, _, v = w[2:].partition("=")
            flags[k] = v
        else:
            words.append(w)
    return flags, words


def matches(src, included):
    """The context paths a COPY source names (a file, a directory, or a glob)."""
    src = os.path.normpath(src.lstrip("/"))
    if src == ".":
        return sorted(included)
    return sorted(p for p in included if p == src or fnmatch.fnmatchcase(p, src) or p.startswith(src + "/"))


class Image:
    def __init__(self, service, context, dockerfile):
        self.service, self.context, self.dockerfile = service, context, dockerfile
        self.included = set(exclude_paths(context, dockerignore(context)))
        self.stages = []  # names
        self.copies = {}  # stage index -> [(sources, dest)]
        self.entrypoint = None
        self.cargo_stage = None  # the stage that runs cargo build
        self.parse()

    def where(self, n):
        return f"{os.path.relpath(self.dockerfile)}:{n}"

    def parse(self):
        stage = -1
        for n, ins, rest in instructions(self.dockerfile):
            if ins == "FROM":
                stage += 1
                m = re.search(r"\s+AS\s+(\S+)\s*$", rest, re.I)
                self.stages.append(m.group(1) if m else str(stage))
                self.copies[stage] = []
                self.entrypoint = None
            elif ins in ("COPY", "ADD"):
                flags, words = split_args(rest)
                if len(words) < 2:
                    problem(f"{self.where(n)}: {ins} needs a source and a destination")
                    continue
                *sources, dest = words
                if "from" in flags:
                    if flags["from"] not in self.stages[:stage]:
                        problem(f"{self.where(n)}: COPY --from={flags['from']} names no earlier stage")
                    continue
                for s in sources:
                    if re.match(r"^[a-z]+://", s):
                        continue
                    full = os.path.normpath(os.path.join(self.context, s))
                    if not inside(full, self.context):
                        problem(f"{self.where(n)}: {ins} source {s} is outside the build context")
                    elif not matches(s, self.included):
                        why = "excluded by .dockerignore" if os.path.exists(full) else "does not exist"
                        problem(f"{self.where(n)}: {ins} source {s} {why} (context {self.context})")
                self.copies[stage].append((sources, dest))
            elif ins == "ENTRYPOINT":
                _, words = split_args(rest)
                self.entrypoint = (n, words) if rest.startswith("[") else None
            elif ins == "RUN" and re.search(r"\bcargo\s+build\b", rest) and self.cargo_stage is None:
                self.cargo_stage = stage
        if not self.stages:
            problem(f"{self.where(1)}: no FROM")

    def source_of(self, image_path):
        """The context file the final stage COPYs to the absolute image_path, if any."""
        for sources, dest in self.copies.get(len(self.stages) - 1, []):
            for s in sources:
                s = os.path.normpath(s)
                if os.path.isdir(os.path.join(self.context, s)):
                    # A directory's contents go into dest.
                    if image_path.startswith(dest.rstrip("/") + "/"):
                        return os.path.join(s, os.path.relpath(image_path, dest))
                elif dest.endswith("/") or len(sources) > 1:
                    if os.path.join(dest, os.path.basename(s)) == image_path:
                        return s
                elif dest == image_path:
                    return s
        return None

    def check_runs(self, what, path):
        """An absolute path the container executes, if COPYed from the context (our images
        keep such files under /opt/aqgate/), must come from an executable file."""
        if not path.startswith("/"):
            return  # found on PATH: a system binary (pg_isready, aqgate from the build stage, …)
        src = self.source_of(path)
        if src is None:
            if path.startswith("/opt/"):
                problem(
                    f"{self.service}: {what} runs {path}, "
                    f"which no COPY in {os.path.relpath(self.dockerfile)} puts there"
                )
            return
        full = os.path.join(self.context, src)
        if not os.path.isfile(full):
            problem(f"{self.service}: {what} runs {path} from {src}, which is not a file")
        elif not os.access(full, os.X_OK):
            problem(f"{self.service}: {what} runs {path} from {src}, which is not executable (needs git mode 100755)")

    def copied_in_build(self, rel):
        """Is context path rel copied into the stage that runs cargo?"""
        for sources, dest in self.copies.get(self.cargo_stage, []):
            for s in sources:
                s = os.path.normpath(s)
                if rel == s or rel.startswith(s + "/") or fnmatch.fnmatchcase(rel, s):
                    return True
        return False


def test_only_files(src_root):
    """Source files that are test-only modules (`#[cfg(test)] mod x;`, or named tests.rs)."""
    skip = set()
    for dirpath, _, files in os.walk(src_root):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(dirpath, f)
            if f == "tests.rs":
                skip.add(path)
            text = open(path, encoding="utf-8").read()
            for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*mod\s+(\w+)\s*;", text):
                base = dirpath if f in ("mod.rs", "lib.rs", "main.rs") else os.path.join(dirpath, f[:-3])
                skip.add(os.path.join(base, m.group(1) + ".rs"))
                skip.add(os.path.join(base, m.group(1), "mod.rs"))
    return skip


def embedded_files(repo):
    """(source file:line, path) of every file the crate embeds outside test-only code."""
    out = []
    roots = [os.path.join(repo, "src")] + sorted(glob.glob(os.path.join(repo, "crates", "*", "src")))
    for src_root in roots:
        out.extend(embedded_in(repo, src_root))
    return out


def embedded_in(repo, src_root):
    """embedded_files for one package (its manifest directory is src_root's parent)."""
    skip = test_only_files(src_root)
    package = os.path.dirname(src_root)
    out = []
    for dirpath, _, files in os.walk(src_root):
        for f in sorted(files):
            path = os.path.join(dirpath, f)
            if not f.endswith(".rs") or path in skip:
                continue
            text = open(path, encoding="utf-8").read()
            # An inline test module runs to the end of its file (the convention here).
            cut = re.search(r"^\s*#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*mod\s+\w+\s*\{", text, re.M)
            code = text[: cut.start()] if cut else text
            for m in re.finditer(r'include_(?:str|bytes)!\(\s*"([^"]+)"\s*\)', code):
                line = code.count("\n", 0, m.start()) + 1
                out.append((f"{os.path.relpath(path, repo)}:{line}", os.path.normpath(os.path.join(dirpath, m.group(1)))))
            for m in re.finditer(r'migrate!\(\s*"([^"]+)"\s*\)', code):
                line = code.count("\n", 0, m.start()) + 1
                out.append((f"{os.path.relpath(path, repo)}:{line}", os.path.normpath(os.path.join(package, m.group(1)))))
    return out


def check_profiles(services):
    """Profiles (`docker compose --profile P up`): a service starts with no profile given when
    it has none, and with P when P is among its profiles. What a service depends on must start
    whenever it does: a service of no profile depends only on services of none, one of
    profile P only on services of none or of P."""
    for name, svc in services.items():
        mine = set(svc.get("profiles") or [])
        deps = svc.get("depends_on") or {}
        for dep in deps if isinstance(deps, (dict, list)) else []:
            if dep not in services:
                problem(f"{name}: depends on {dep}, which is not a service")
                continue
            theirs = set(services[dep].get("profiles") or [])
            if theirs and (not mine or not mine <= theirs):
                want = ", ".join(sorted(mine)) or "no profile"
                problem(f"{name} ({want}) depends on {dep}, which starts only with profile {', '.join(sorted(theirs))}")


def main():
    resolved, repo = sys.argv[1], os.path.realpath(sys.argv[2])
    with open(resolved) as fh:
        config = yaml.safe_load(fh)
    used_dockerfiles = set()
    services = config.get("services") or {}
    if not services:
        problem("compose.yaml has no services")
    for name, svc in services.items():
        image = None
        build = svc.get("build")
        if build is not None:
            if isinstance(build, str):
                build = {"context": build}
            context = os.path.realpath(build.get("context", "."))
            if not os.path.isdir(context):
                problem(f"{name}: build context {context} is not a directory")
                continue
            if not inside(context, repo):
                problem(f"{name}: build context {context} is outside the repository")
            dockerfile = os.path.realpath(os.path.join(context, build.get("dockerfile", "Dockerfile")))
            if not os.path.isfile(dockerfile):
                problem(f"{name}: Dockerfile {dockerfile} does not exist")
                continue
            used_dockerfiles.add(dockerfile)
            image = Image(name, context, dockerfile)
            if image.entrypoint:
                n, words = image.entrypoint
                if words:
                    image.check_runs(f"ENTRYPOINT ({image.where(n)})", words[0])
            if image.cargo_stage is not None:
                for where, path in embedded_files(repo):
                    rel = os.path.relpath(path, context)
                    if not inside(path, context):
                        problem(f"{where}: the binary embeds {rel}, outside the build context of {name}")
                    elif not os.path.exists(path):
                        problem(f"{where}: the binary embeds {rel}, which does not exist")
                    elif not matches(rel, image.included):
                        problem(f"{where}: the binary embeds {rel}, excluded by .dockerignore")
                    elif not image.copied_in_build(rel):
                        problem(f"{where}: the binary embeds {rel}, which {os.path.relpath(dockerfile)} does not COPY into its build stage")
        elif not svc.get("image"):
            problem(f"{name}: neither build nor image")
        hc = (svc.get("healthcheck") or {}).get("test")
        if isinstance(hc, list) and len(hc) > 1 and hc[0] == "CMD" and image is not None:
            image.check_runs("its healthcheck", hc[1])
        for v in svc.get("volumes") or []:
            if isinstance(v, dict):
                kind, source = v.get("type"), v.get("source", "")
            else:
                source = v.split(":")[0]
                kind = "bind" if source.startswith(("/", ".", "~")) else "volume"
            if kind == "bind":
                if not os.path.exists(source):
                    problem(f"{name}: bind mount source {source} does not exist")
                elif not inside(source, repo):
                    problem(f"{name}: bind mount source {source} is outside the repository")
    check_profiles(services)
    for dirpath, dirs, files in os.walk(repo):
        dirs[:] = [d for d in dirs if d not in (".git", "target")]
        for f in files:
            if f == "Dockerfile" or f.endswith(".Dockerfile"):
                path = os.path.realpath(os.path.join(dirpath, f))
                if path not in used_dockerfiles:
                    problem(f"{os.path.relpath(path, repo)} is not built by any service in compose.yaml")
    for p in problems:
        print(f"validate-compose: {p}", file=sys.stderr)
    if problems:
        sys.exit(1)
    print(f"validate-compose: {len(services)} services, {len(used_dockerfiles)} Dockerfiles: every referenced file is there")


if __name__ == "__main__":
    main()
