"""CURVE key files and endpoint rules, without sockets."""

from __future__ import annotations

from pathlib import Path

import pytest

from dyper.agent import check_endpoint, is_loopback_endpoint, load_keys
from dyper.monitor.commands.keys import make_pair
from dyper.monitor.curve import CurveError, load_server_keys, read_authorized


def test_off_loopback_needs_curve_and_loopback_does_not():
    for endpoint in ("tcp://127.0.0.1:7341", "tcp://localhost:7341", "tcp://[::1]:7341", "ipc:///tmp/x.sock"):
        assert check_endpoint(endpoint) == endpoint
    for endpoint in ("tcp://10.0.0.5:7341", "tcp://0.0.0.0:7341", "tcp://monitor.example:7341"):
        assert not is_loopback_endpoint(endpoint)
        with pytest.raises(ValueError, match="dyper keys"):
            check_endpoint(endpoint)
        assert check_endpoint(endpoint, curve=True) == endpoint
    with pytest.raises(ValueError, match="tcp://HOST:PORT"):
        check_endpoint("udp://10.0.0.5:7341", curve=True)


def test_load_keys_reads_what_dyper_keys_wrote(tmp_path: Path):
    monitor_public, _ = make_pair(tmp_path, "monitor")
    agent_public, agent_secret = make_pair(tmp_path, "agent")
    assert load_keys(None, None) is None
    keys = load_keys(str(monitor_public), str(agent_secret))
    assert keys is not None
    server, public, secret = keys
    assert len(server) == len(public) == len(secret) == 40
    assert public == agent_public.read_text().split('public-key = "')[1][:40].encode()


def test_a_damaged_key_is_refused_in_one_line(tmp_path: Path):
    monitor_public, _ = make_pair(tmp_path, "monitor")
    _, agent_secret = make_pair(tmp_path, "agent")
    text = agent_secret.read_text()
    agent_secret.write_text(text.replace('secret-key = "', 'secret-key = "~~'))
    with pytest.raises(ValueError, match="damaged") as err:
        load_keys(str(monitor_public), str(agent_secret))
    assert "\n" not in str(err.value)
    (tmp_path / "junk.key").write_text("hello\n")
    with pytest.raises(ValueError, match="not a certificate"):
        load_keys(str(tmp_path / "junk.key"), str(agent_secret))


def test_the_monitor_takes_its_secret_and_a_directory_of_public_keys(tmp_path: Path):
    _, monitor_secret = make_pair(tmp_path / "keys", "monitor")
    agent_public, agent_secret = make_pair(tmp_path / "keys", "agent")
    authorized = tmp_path / "authorized"
    authorized.mkdir()
    (authorized / "agent.key").write_bytes(agent_public.read_bytes())
    keys = load_server_keys(str(monitor_secret), str(authorized))
    assert len(keys.keys) == 1 and len(keys.secret) == 40

    with pytest.raises(CurveError, match=r"not NAME\.key"):
        load_server_keys(str(agent_public), str(authorized))
    with pytest.raises(CurveError, match="not a directory"):
        load_server_keys(str(monitor_secret), str(tmp_path / "nowhere"))
    # A secret certificate dropped among the public ones is refused, not taken as a public key.
    (authorized / "oops.key").write_bytes(agent_secret.read_bytes())
    with pytest.raises(CurveError, match=r"oops\.key holds a secret key"):
        load_server_keys(str(monitor_secret), str(authorized))
    keys_found, bad = read_authorized(authorized)
    assert len(keys_found) == 1 and len(bad) == 1
