"""Who may use the sudo stand-in (``sudo_server.py``): the rule, read from the image's files.

A caller may run commands as anyone when it is:

- root (uid 0);
- ``user``, the account E2B gives passwordless sudo in every template;
- a member of group ``sudo`` or ``wheel`` (primary group or listed in ``/etc/group``);
- named, directly (``name``, ``#uid``) or by group (``%group``), in an ``/etc/sudoers`` or
  ``/etc/sudoers.d/*`` rule that grants every command as anyone: ``ALL`` after an optional
  ``(ALL)`` / ``(ALL:ALL)`` and tags such as ``NOPASSWD:``.

The stand-in cannot restrict commands or ask for a password, so rules limited to some commands
are not honoured (they would grant everything), and a rule that would ask for a password is
honoured without asking. Aliases, negations and ``Defaults`` are ignored.
"""

from __future__ import annotations

import grp
import pwd
import re
from collections.abc import Iterator
from pathlib import Path

DEFAULT_ACCOUNT = "user"
ADMIN_GROUPS = ("sudo", "wheel")
SUDOERS = Path("/etc/sudoers")
SUDOERS_DIR = Path("/etc/sudoers.d")

_KEYWORDS = ("Defaults", "User_Alias", "Runas_Alias", "Host_Alias", "Cmnd_Alias")
#: ``HOSTS = [(ALL[:ALL])] [TAG: ...] ALL`` — the only command part that means "anything".
_GRANTS_ALL = re.compile(
    r"^[^=]+=\s*(\(\s*ALL\s*(:\s*ALL\s*)?\)\s*)?([A-Z_]+:\s*)*ALL$"
)
_USER_LIST = re.compile(r"^(?P<users>[^\s,=]+(\s*,\s*[^\s,=]+)*)\s+(?P<rest>.+)$")


def may_sudo(uid: int, sudoers: Path = SUDOERS, sudoers_dir: Path = SUDOERS_DIR) -> bool:
    if uid == 0:
        return True
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return False
    if entry.pw_name == DEFAULT_ACCOUNT:
        return True
    groups = _group_names(entry.pw_name, entry.pw_gid)
    if groups & set(ADMIN_GROUPS):
        return True
    names = {"ALL", entry.pw_name, f"#{uid}"} | {f"%{g}" for g in groups}
    text = "\n".join(_sudoers_files(sudoers, sudoers_dir))
    return any(names & set(users) for users in granted_user_lists(text))


def _group_names(name: str, primary_gid: int) -> set[str]:
    names = set()
    for group in grp.getgrall():
        if group.gr_gid == primary_gid or name in group.gr_mem:
            names.add(group.gr_name)
    return names


def _sudoers_files(sudoers: Path, sudoers_dir: Path) -> Iterator[str]:
    files = [sudoers]
    try:
        # sudo skips names with a dot or ending in "~" (editor backups, package leftovers).
        files += sorted(
            p for p in sudoers_dir.iterdir() if "." not in p.name and not p.name.endswith("~")
        )
    except OSError:
        pass
    for path in files:
        try:
            yield path.read_text(errors="replace")
        except OSError:
            continue


def granted_user_lists(sudoers: str) -> Iterator[list[str]]:
    """The user lists of the rules in ``sudoers`` (a file's text) that grant every command
    (see the module docstring)."""
    for raw in sudoers.replace("\\\n", " ").splitlines():
        line = _strip_comment(raw).strip()
        if not line or line.split()[0].startswith(_KEYWORDS) or line.startswith("@"):
            continue
        match = _USER_LIST.match(line)
        if match is None or not _GRANTS_ALL.match(match["rest"].strip()):
            continue
        yield [u.strip() for u in match["users"].split(",")]


def _strip_comment(line: str) -> str:
    # "#123" is a uid, not a comment; "#include" lines are directives, handled by reading
    # /etc/sudoers.d anyway.
    for i, ch in enumerate(line):
        if ch == "#" and not line[i + 1 : i + 2].isdigit():
            return line[:i]
    return line


def caller_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"

