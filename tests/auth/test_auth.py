"""broker.auth: password hashes, Mosquitto-format ACLs, reload, and the `meshmq passwd` CLI."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from broker import auth
from broker.auth import (
    BAD_USERNAME_OR_PASSWORD,
    CONNACK_OK,
    NOT_AUTHORIZED,
    Authenticator,
    AuthFileError,
    delete_user,
    filter_covers,
    hash_password,
    load_passwords,
    parse_acl,
    verify_password,
    write_password,
)
from broker.settings import AuthSettings

ROOT = Path(__file__).resolve().parents[2]


def make_auth(tmp_path: Path, acl: str | None = None, users: dict[str, str] | None = None,
              allow_anonymous: bool = True) -> Authenticator:
    acl_file = pw_file = None
    if acl is not None:
        acl_file = tmp_path / "acl"
        acl_file.write_text(acl)
    if users is not None:
        pw_file = tmp_path / "passwd"
        for user, password in users.items():
            write_password(str(pw_file), user, password)
    return Authenticator(AuthSettings(allow_anonymous=allow_anonymous,
                                      password_file=str(pw_file) if pw_file else None,
                                      acl_file=str(acl_file) if acl_file else None))


# ---------------------------------------------------------------------------- passwords


def test_hash_format_and_verify():
    stored = hash_password("s3cret")
    assert stored.startswith("$scrypt$n=16384,r=8,p=1$")
    _, _, _, salt, digest = stored.split("$")
    import base64

    assert len(base64.b64decode(salt)) == 16
    assert verify_password(stored, "s3cret")
    assert verify_password(stored, b"s3cret")
    assert not verify_password(stored, "s3cret!")
    assert hash_password("s3cret") != stored  # fresh salt each time


def test_authenticate(tmp_path):
    a = make_auth(tmp_path, users={"alice": "pw-a", "bob": "pw-b"})
    assert a.uses_passwords
    assert a.authenticate("alice", b"pw-a") == CONNACK_OK
    assert a.authenticate("bob", b"pw-b") == CONNACK_OK
    assert a.authenticate("alice", b"pw-b") == BAD_USERNAME_OR_PASSWORD
    assert a.authenticate("carol", b"pw-a") == BAD_USERNAME_OR_PASSWORD
    assert a.authenticate("alice", None) == BAD_USERNAME_OR_PASSWORD
    assert a.authenticate(None, None) == CONNACK_OK  # anonymous allowed


def test_anonymous_refused_when_disallowed(tmp_path):
    a = make_auth(tmp_path, users={"alice": "pw"}, allow_anonymous=False)
    assert a.authenticate(None, None) == NOT_AUTHORIZED
    assert a.authenticate("alice", b"pw") == CONNACK_OK


def test_no_password_file_accepts_usernames():
    a = Authenticator(AuthSettings())
    assert not a.uses_passwords and not a.acl_enabled
    assert a.authenticate("anyone", b"anything") == CONNACK_OK
    assert a.can_publish("anyone", "c", "any/topic")
    assert a.can_subscribe(None, "c", "#")


def test_write_replace_delete(tmp_path):
    path = str(tmp_path / "passwd")
    write_password(path, "alice", "one")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    write_password(path, "bob", "two")
    write_password(path, "alice", "three")
    users = load_passwords(path)
    assert set(users) == {"alice", "bob"}
    assert users["alice"].check(b"three") and not users["alice"].check(b"one")
    assert Path(path).read_text().count("alice:") == 1
    delete_user(path, "alice")
    assert set(load_passwords(path)) == {"bob"}
    with pytest.raises(KeyError):
        delete_user(path, "alice")


@pytest.mark.parametrize("user", ["", "a:b", "a\nb", " a", "#a"])
def test_bad_usernames_rejected(tmp_path, user):
    with pytest.raises(ValueError):
        write_password(str(tmp_path / "p"), user, "pw")


@pytest.mark.parametrize(("text", "fragment"), [
    ("alice\n", "expected user:hash"),
    ("alice:secret\n", "$scrypt$"),
    ("alice:$scrypt$n=3,r=8,p=1$AAAA$AAAAAAAAAAAAAAAAAAAAAA==\n", "out of range"),
    ("alice:$scrypt$n=16384,r=8,p=1$!!$AAAA\n", "$scrypt$"),
])
def test_bad_password_file_lines(tmp_path, text, fragment):
    path = tmp_path / "passwd"
    path.write_text("# comment\n\n" + text)
    with pytest.raises(AuthFileError) as info:
        load_passwords(str(path))
    assert f"{path}:3" in str(info.value) and fragment in str(info.value)


def test_duplicate_user_is_an_error(tmp_path):
    path = tmp_path / "passwd"
    line = f"alice:{hash_password('x')}\n"
    path.write_text(line + line)
    with pytest.raises(AuthFileError, match="twice"):
        load_passwords(str(path))


def test_mosquitto_passwd_hashes_accepted(tmp_path, mosquitto_passwd_bin):
    path = tmp_path / "mosq"
    subprocess.run([mosquitto_passwd_bin, "-b", "-c", str(path), "alice", "secret"], check=True,
                   capture_output=True)
    a = Authenticator(AuthSettings(password_file=str(path)))
    assert a.authenticate("alice", b"secret") == CONNACK_OK
    assert a.authenticate("alice", b"Secret") == BAD_USERNAME_OR_PASSWORD


# ---------------------------------------------------------------------------- topic coverage


@pytest.mark.parametrize(("rule", "filt", "covered"), [
    ("a/b", "a/b", True),
    ("a/b", "a/c", False),
    ("a/+", "a/b", True),
    ("a/+", "a/+", True),
    ("a/+", "a/#", False),
    ("a/+", "a/b/c", False),
    ("a/#", "a", True),
    ("a/#", "a/#", True),
    ("a/#", "a/+/c", True),
    ("a/b/#", "a/+/#", False),
    ("#", "a/b", True),
    ("#", "#", True),
    ("+/+", "a/+", True),
    ("a/+/c", "a/+/c", True),
    ("a/b/c", "a/+/c", False),
    ("#", "$SYS/x", False),
    ("+/x", "$SYS/x", False),
    ("$SYS/#", "$SYS/broker/load", True),
    ("a", "a/b", False),
    ("a/b", "a", False),
])
def test_filter_covers(rule, filt, covered):
    assert filter_covers(rule, filt) is covered


# ---------------------------------------------------------------------------- ACL decisions

ACL = """
# anonymous clients
topic read public/#

user alice
topic readwrite alice/#
topic read shared/+/status
topic deny alice/private/#

user bob
topic write bob/out

client sensor-7
topic write sensors/7/#

pattern readwrite devices/%c/#
pattern read users/%u/inbox/#
pattern deny devices/%c/admin/#
"""


def test_anonymous_section(tmp_path):
    a = make_auth(tmp_path, ACL)
    assert a.acl_enabled
    assert a.can_subscribe(None, "anon", "public/news")
    assert a.can_subscribe(None, "anon", "public/#")
    assert not a.can_publish(None, "anon", "public/news")  # read only
    assert not a.can_subscribe(None, "anon", "alice/x")
    # anonymous rules do not apply to named users
    assert not a.can_subscribe("alice", "c", "public/news")


def test_user_sections_and_default_deny(tmp_path):
    a = make_auth(tmp_path, ACL)
    assert a.can_publish("alice", "c1", "alice/x/y")
    assert a.can_subscribe("alice", "c1", "alice/#")  # covered by alice/#
    assert not a.can_publish("alice", "c1", "shared/1/status")  # read only
    assert a.can_subscribe("alice", "c1", "shared/1/status")
    assert a.can_subscribe("alice", "c1", "shared/+/status")
    assert not a.can_subscribe("alice", "c1", "shared/#")  # wider than the grant
    assert a.can_publish("bob", "c2", "bob/out")
    assert not a.can_subscribe("bob", "c2", "bob/out")  # write only
    assert not a.can_publish("carol", "c3", "alice/x")  # unknown user: nothing granted


def test_deny_wins(tmp_path):
    a = make_auth(tmp_path, ACL)
    assert not a.can_publish("alice", "c1", "alice/private/key")
    assert not a.can_subscribe("alice", "c1", "alice/private/#")
    assert not a.can_subscribe("alice", "c1", "alice/private/+")
    # a subscription that merely overlaps the deny is allowed; delivery filters per message
    assert a.can_subscribe("alice", "c1", "alice/#")
    assert not a.can_deliver("alice", "c1", "alice/private/key")
    assert a.can_deliver("alice", "c1", "alice/public")
    # a deny pattern beats the readwrite pattern for the same client
    assert a.can_publish(None, "dev1", "devices/dev1/telemetry")
    assert not a.can_publish(None, "dev1", "devices/dev1/admin/reboot")


def test_pattern_substitution(tmp_path):
    a = make_auth(tmp_path, ACL)
    assert a.can_publish("bob", "dev42", "devices/dev42/t")
    assert not a.can_publish("bob", "dev42", "devices/dev43/t")
    assert a.can_subscribe("bob", "x", "users/bob/inbox/#")
    assert not a.can_subscribe("bob", "x", "users/alice/inbox/#")
    # %u never applies to anonymous clients
    assert not a.can_subscribe(None, "x", "users//inbox/#")


@pytest.mark.parametrize("client_id", ["#", "+", "dev/1"])
def test_pattern_ignores_wildcard_ids(tmp_path, client_id):
    a = make_auth(tmp_path, ACL)
    assert not a.can_publish(None, client_id, f"devices/{client_id}/x".replace("#", "a"))
    assert not a.can_subscribe(None, client_id, "devices/#")
    assert not a.can_publish(None, client_id, "devices/dev/1/x")


def test_client_sections(tmp_path):
    a = make_auth(tmp_path, ACL)
    assert a.can_publish(None, "sensor-7", "sensors/7/temp")
    assert a.can_publish("bob", "sensor-7", "sensors/7/temp")  # user and client both apply
    assert a.can_publish("bob", "sensor-7", "bob/out")
    assert not a.can_publish(None, "sensor-8", "sensors/7/temp")


def test_shared_subscription_checked_on_filter(tmp_path):
    a = make_auth(tmp_path, ACL)
    assert a.can_subscribe("alice", "c", "$share/g1/alice/#")
    assert not a.can_subscribe("alice", "c", "$share/g1/bob/#")


def test_decision_cache_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(auth, "DECISION_CACHE_SIZE", 8)
    a = make_auth(tmp_path, ACL)
    for i in range(50):
        a.can_publish("alice", "c", f"alice/{i}")
    assert len(a._publish_cache) <= 8
    assert a.can_publish("alice", "c", "alice/49")
    long_topic = "alice/" + "x" * 1000
    assert a.can_publish("alice", "c", long_topic)
    assert ("alice", "c", long_topic) not in a._publish_cache


@pytest.mark.parametrize(("text", "fragment"), [
    ("topic reed a/b\n", "unknown access 'reed'"),
    ("user\n", "needs a name"),
    ("topc read a\n", "unknown directive 'topc'"),
    ("topic read a/#/b\n", "invalid topic filter"),
    ("topic read a+\n", "invalid topic filter"),
])
def test_acl_errors_name_line(text, fragment):
    with pytest.raises(AuthFileError) as info:
        parse_acl("# header\n" + text, "acl.conf")
    assert "acl.conf:2" in str(info.value) and fragment in str(info.value)


def test_acl_topic_without_access_is_readwrite():
    rules = parse_acl("user u\ntopic a/b\ntopic readwrite with space/x\n")
    assert [(r.topic, r.access) for r in rules.users["u"]] == [("a/b", 3), ("with space/x", 3)]


# ---------------------------------------------------------------------------- reload


def test_reload_applies_new_rules(tmp_path):
    a = make_auth(tmp_path, "user alice\ntopic write a/#\n")
    assert a.can_publish("alice", "c", "a/1")
    (tmp_path / "acl").write_text("user alice\ntopic write b/#\n")
    assert a.reload()
    assert not a.can_publish("alice", "c", "a/1")  # cache cleared
    assert a.can_publish("alice", "c", "b/1")


def test_reload_keeps_old_rules_on_broken_file(tmp_path, caplog):
    a = make_auth(tmp_path, "user alice\ntopic write a/#\n", users={"alice": "pw"})
    assert a.can_publish("alice", "c", "a/1")
    (tmp_path / "acl").write_text("user alice\ntopic wrte a/#\n")
    with caplog.at_level(logging.ERROR, logger="broker.auth"):
        assert not a.reload()
    assert "keeping the previous rules" in caplog.text
    assert a.can_publish("alice", "c", "a/1")
    (tmp_path / "passwd").write_text("garbage\n")
    (tmp_path / "acl").write_text("user alice\ntopic write a/#\n")
    assert not a.reload()
    assert a.authenticate("alice", b"pw") == CONNACK_OK
    (tmp_path / "passwd").unlink()
    assert not a.reload()
    assert a.authenticate("alice", b"pw") == CONNACK_OK


def test_reload_with_new_settings(tmp_path):
    a = make_auth(tmp_path)
    assert a.can_publish(None, "c", "x")
    acl = tmp_path / "acl2"
    acl.write_text("topic read x\n")
    assert a.reload(AuthSettings(acl_file=str(acl)))
    assert not a.can_publish(None, "c", "x")


def test_constructor_raises_on_broken_files(tmp_path):
    with pytest.raises(AuthFileError):
        make_auth(tmp_path, "nonsense\n")


# ---------------------------------------------------------------------------- CLI


def run_cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "meshmq", *args], input=stdin, text=True,
                          capture_output=True, cwd=ROOT, timeout=60)


def test_cli_passwd_creates_usable_file(tmp_path):
    path = tmp_path / "passwd"
    result = run_cli("passwd", str(path), "alice", stdin="correct horse\n")
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    result = run_cli("passwd", str(path), "bob", stdin="battery staple\n")
    assert result.returncode == 0, result.stderr
    a = Authenticator(AuthSettings(allow_anonymous=False, password_file=str(path)))
    assert a.authenticate("alice", b"correct horse") == CONNACK_OK
    assert a.authenticate("bob", b"battery staple") == CONNACK_OK
    assert a.authenticate("alice", b"correct horse\n") == BAD_USERNAME_OR_PASSWORD

    result = run_cli("passwd", str(path), "alice", "--delete")
    assert result.returncode == 0, result.stderr
    assert set(load_passwords(str(path))) == {"bob"}
    result = run_cli("passwd", str(path), "alice", "--delete")
    assert result.returncode == 1 and "no user 'alice'" in result.stderr


def test_cli_passwd_rejects_empty_password(tmp_path):
    result = run_cli("passwd", str(tmp_path / "p"), "alice", stdin="")
    assert result.returncode == 1 and "empty" in result.stderr
    assert not (tmp_path / "p").exists()
