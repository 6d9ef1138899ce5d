"""Edit, regenerate and rebase the jax patch series as git commits.

    python build/patch_series.py checkout DIR [--version V] [--wheel WHEEL]
    python build/patch_series.py export DIR [--version V]

``checkout`` unpacks the published jax wheel of version V (from
``build/_work/downloads/``, where ``build/build.py`` caches it, or
``--wheel``) into DIR as a git repository: one commit "stock jax V", then one
commit per patch of ``jax_patch/V/series``, whose message is the patch's
description. Edit there with git as usual: amend a commit with
``git commit --fixup`` and ``git rebase -i --autosquash``, add a commit for a
new patch, or rebase the whole series onto another version's stock commit.

``export`` writes the commits after "stock jax V" back as
``jax_patch/V/NNNN-<subject>.patch`` files (description, then ``diff -u``
with three lines of context, the form ``patch -p1`` applies), rewrites
``series``, and writes each module the series adds, as the last commit
leaves it, under ``jax_patch/V/modules/`` (where the formatter, the
duplicate finder and the structure checks read it; a test checks it
against the series). The subject is the commit's first line, which must be the file
name without number and ending, e.g. ``scan-ys-apart-from-carry``; the rest
of the message is the description.
"""

import argparse
from collections.abc import Iterator
import contextlib
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from build_common import DEFAULT_VERSION, PATCH_ROOT, REPO, BuildError
from jax_series import MODULES, apply_patches, cached_stock_jax, read_series

STOCK_SUBJECT = "stock jax {version}"


def git(cwd: Path, *args: str, stdin: str | None = None) -> str:
  result = subprocess.run(
      [
          "git",
          "-c",
          "user.name=patch_series",
          "-c",
          "user.email=patch_series@localhost",
          *args,
      ],
      cwd=cwd,
      input=stdin,
      capture_output=True,
      text=True,
  )
  if result.returncode != 0:
    sys.exit(f"git {' '.join(args)} failed:\n{result.stderr}")
  return result.stdout


def split_patch(text: str) -> tuple[str, str]:
  """A patch file's description and its diff, which starts at its first
  file: an existing one (`--- a/...`) or a new one (`--- /dev/null`)."""
  at = re.search(r"^--- (a/|/dev/null$)", text, re.MULTILINE)
  if at is None:
    sys.exit("a patch file without a diff")
  return text[: at.start()].strip("\n"), text[at.start() :]


def checkout(folder: Path, version: str, wheel: Path | None) -> None:
  if folder.exists():
    sys.exit(f"{folder} exists")
  folder.mkdir(parents=True)
  with zipfile.ZipFile(wheel or cached_stock_jax(version)) as archive:
    archive.extractall(
        folder, [n for n in archive.namelist() if n.startswith("jax/")]
    )
  git(folder, "init", "-q")
  # A venv pointed at the checkout writes bytecode there: never a change.
  with open(folder / ".git" / "info" / "exclude", "a") as exclude:
    exclude.write("__pycache__/\n")
  git(folder, "add", "-A")
  git(folder, "commit", "-q", "-m", STOCK_SUBJECT.format(version=version))
  patches = read_series(version)
  for path in patches:
    description, _ = split_patch(path.read_text())
    apply_patches(folder, [path])
    subject = re.sub(r"^\d+-", "", path.stem)
    git(folder, "add", "-A")
    git(
        folder, "commit", "-q", "-F", "-", stdin=f"{subject}\n\n{description}\n"
    )
  print(f"{folder}: stock jax {version} and {len(patches)} " "patch commits")


@contextlib.contextmanager
def checked_out(version: str, folder: Path | None) -> Iterator[Path]:
  """The series checked out: ``folder`` as it is, a checkout made by
  ``checkout`` (so that several checks share one), or else a temporary one."""
  if folder is not None:
    yield folder
    return
  with tempfile.TemporaryDirectory() as scratch:
    checkout(Path(scratch) / "jax", version, None)
    yield Path(scratch) / "jax"


def export(folder: Path, version: str) -> None:
  log = git(folder, "log", "--reverse", "--format=%H %s").splitlines()
  stock = [
      line.split()[0]
      for line in log
      if line.split(" ", 1)[1] == STOCK_SUBJECT.format(version=version)
  ]
  if len(stock) != 1:
    sys.exit(
        f"{folder} has no single commit '{STOCK_SUBJECT.format(version=version)}'"
    )
  commits = git(folder, "rev-list", "--reverse", f"{stock[0]}..HEAD").split()
  out = PATCH_ROOT / version
  for old in out.glob("*.patch"):
    old.unlink()
  names = []
  for number, commit in enumerate(commits, start=1):
    message = git(folder, "log", "-1", "--format=%B", commit).strip("\n")
    subject, _, description = message.partition("\n")
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", subject):
      sys.exit(f"commit {commit[:12]}: subject {subject!r} is not a file name")
    diff = git(
        folder,
        "diff",
        "-U3",
        "--no-prefix",
        "--no-renames",
        "--src-prefix=a/",
        "--dst-prefix=b/",
        f"{commit}^",
        commit,
    )
    # `patch` needs no git headers: keep only the ---/+++ and hunk lines.
    # Nor the function names git writes after a hunk header.
    diff = "".join(
        re.sub(r"^(@@ [^@]* @@).*", r"\1", line)
        for line in diff.splitlines(keepends=True)
        if not line.startswith(
            ("diff --git", "index ", "new file mode", "deleted file")
        )
    )
    name = f"{number:04d}-{subject}.patch"
    (out / name).write_text(f"{description.strip()}\n\n{diff}")
    names.append(name)
  (out / "series").write_text("".join(f"{n}\n" for n in names))
  modules = out / MODULES
  shutil.rmtree(modules, ignore_errors=True)
  added = git(
      folder, "diff", "--name-only", "--diff-filter=A", stock[0], "HEAD"
  ).split()
  for path in added:
    (modules / path).parent.mkdir(parents=True, exist_ok=True)
    (modules / path).write_text(git(folder, "show", f"HEAD:{path}"))
  print(
      f"wrote {len(names)} patches to {out.relative_to(REPO)}, and the "
      f"{len(added)} modules they add to {modules.relative_to(REPO)}"
  )


def main() -> None:
  parser = argparse.ArgumentParser(
      description=__doc__.split("\n\n")[0],
      formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  parser.add_argument("command", choices=["checkout", "export"])
  parser.add_argument("folder", type=Path)
  parser.add_argument(
      "--version",
      default=DEFAULT_VERSION,
      help="jax version (default: the repository's VERSION, %(default)s)",
  )
  parser.add_argument("--wheel", type=Path, help="the stock jax wheel")
  args = parser.parse_args()
  if shutil.which("patch") is None or shutil.which("git") is None:
    sys.exit("needs git and patch")
  try:
    if args.command == "checkout":
      checkout(args.folder, args.version, args.wheel)
    else:
      export(args.folder, args.version)
  except BuildError as e:
    sys.exit(f"patch_series.py: error: {e}")


if __name__ == "__main__":
  main()
