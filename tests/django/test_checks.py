"""One test per system check id, and the ids are unique."""

from __future__ import annotations

import re
from pathlib import Path

import markdown  # type: ignore[import-untyped]  # no stubs installed
import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from django_redlock.checks import check_settings
from django_redlock.conf import CHECKS_PAGE, check_hint

URL = "redis://127.0.0.1:7001/0"
THREE = [URL, "redis://127.0.0.1:7002/0", "redis://127.0.0.1:7003/0"]


def ids(settings, redlock, caches=None):
    settings.REDLOCK = redlock
    if caches is not None:
        settings.CACHES = caches
    return [message.id for message in check_settings()]


def test_a_good_setting_has_no_messages(settings):
    assert ids(settings, {"NODES": THREE}) == []


@pytest.mark.parametrize(
    ("redlock", "expected"),
    [
        (["not", "a", "dict"], "django_redlock.E001"),
        ({"NODES": THREE, "TLL": 30}, "django_redlock.E002"),
        ({"NODES": []}, "django_redlock.E003"),
        ({"NODES": URL}, "django_redlock.E003"),
        ({"NODES": ["http://127.0.0.1:1"]}, "django_redlock.E004"),
        ({"NODES": [42]}, "django_redlock.E004"),
        ({"NODES": [{"URL": URL, "CACHE": "x"}]}, "django_redlock.E004"),
        ({"NODES": [{"CACHE": "nope"}]}, "django_redlock.E004"),
        ({"NODES": [URL, URL, "redis://127.0.0.1:7002/0"]}, "django_redlock.E005"),
        (
            {"NODES": [URL, "redis://localhost:7001/1", "redis://127.0.0.1:7003/0"]},
            "django_redlock.E005",
        ),
        ({"NODES": THREE, "TTL": 0}, "django_redlock.E006"),
        ({"NODES": THREE, "TTL": "30"}, "django_redlock.E006"),
        ({"NODES": THREE, "DRIFT_FACTOR": 0.5}, "django_redlock.E007"),
        ({"NODES": THREE, "NODE_TIMEOUT": 0}, "django_redlock.E008"),
        ({"NODES": THREE, "TTL": 1.0, "NODE_TIMEOUT": 0.5}, "django_redlock.E008"),
        ({"NODES": THREE, "RETRY_DELAY": -1}, "django_redlock.E009"),
        ({"NODES": THREE, "KEY_PREFIX": 7}, "django_redlock.E010"),
        ({"NODES": THREE, "DEFAULT_TIMEOUT": -1}, "django_redlock.E011"),
        ({"NODES": THREE, "TIMEOUT": 5.0}, "django_redlock.W004"),
        ({"NODES": THREE, "TTL": 30, "MAX_TTL": 10}, "django_redlock.E012"),
        ({"NODES": THREE, "METRICS_LABEL": "full"}, "django_redlock.E013"),
        ({"NODES": THREE[:2]}, "django_redlock.W001"),
        ({"NODES": THREE[:1]}, "django_redlock.W002"),
        ({"NODES": ["redis://:pw@127.0.0.1:7001/0", *THREE[1:]]}, "django_redlock.W003"),
    ],
)
def test_each_check_id(settings, redlock, expected):
    assert expected in ids(settings, redlock)


def test_a_cache_with_another_backend_is_refused(settings):
    caches = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    assert "django_redlock.E004" in ids(settings, {"NODES": [{"CACHE": "default"}]}, caches)


@pytest.mark.parametrize(
    "entry",
    [
        "redis://127.0.0.1:6379/0",
        {"BACKEND": "django.core.cache.backends.redis.RedisCache", "OPTIONS": ["x"]},
    ],
)
def test_a_malformed_caches_entry_is_an_error_not_a_crash(settings, entry):
    # Found by an adversarial test: an AttributeError escaped the check.
    assert "django_redlock.E004" in ids(settings, {"NODES": [{"CACHE": "x"}]}, {"x": entry})


@pytest.mark.parametrize(
    ("nodes", "said"), [(None, "got None"), (42, "got a int"), ("redis://h/0", "got a str")]
)
def test_e003_says_what_it_got(settings, nodes, said):
    settings.REDLOCK = {"NODES": nodes}
    (message,) = check_settings()
    assert message.id == "django_redlock.E003"
    assert said in message.msg


def test_a_missing_setting_is_an_error(settings):
    del settings.REDLOCK
    assert [message.id for message in check_settings()] == ["django_redlock.E003"]


def test_hints_point_to_the_documentation(settings):
    """Each hint ends with the address of its id's entry, which a user of the wheel can open
    (it named docs/reference/checks.md, a path only a clone has: issue 40, item 8)."""
    settings.REDLOCK = {"NODES": [], "DRIFT_FACTOR": 2}
    messages = check_settings()
    del settings.REDLOCK
    messages += check_settings()
    assert [message.id for message in messages] == [
        "django_redlock.E003",
        "django_redlock.E007",
        "django_redlock.E003",
    ]
    for message in messages:
        anchor = str(message.id).replace(".", "").lower()
        assert (message.hint or "").endswith(f" See {CHECKS_PAGE}#{anchor}"), message.hint


def test_the_hints_address_is_the_repositorys_page_with_an_anchor_per_id():
    """CHECKS_PAGE is mkdocs.yml's site (site_url) or, without one, the page in the repository
    (repo_url), and every check's anchor is the one its heading gets (MkDocs' toc and GitHub
    both drop the punctuation and lower the case)."""
    root = Path(__file__).parents[2]
    mkdocs = (root / "mkdocs.yml").read_text()
    site = re.search(r"^site_url: (\S+)$", mkdocs, flags=re.MULTILINE)
    repo = re.search(r"^repo_url: (\S+)$", mkdocs, flags=re.MULTILINE)
    assert repo is not None
    if site is not None:
        assert site[1].rstrip("/") + "/reference/checks/" == CHECKS_PAGE
    else:
        assert f"{repo[1]}/blob/main/docs/reference/checks.md" == CHECKS_PAGE
    page = (root / "docs" / "reference" / "checks.md").read_text()
    html = markdown.markdown(page, extensions=["toc"])
    anchors = set(re.findall(r'<h2 id="([^"]+)"><code>(django_redlock\.[EW]\d{3})</code>', html))
    assert len(anchors) >= 18, html
    for anchor, check_id in anchors:
        hint = check_hint(check_id, "Do this.")
        assert hint == f"Do this. See {CHECKS_PAGE}#{anchor}"


def test_the_check_is_registered_and_blocks_manage_py(settings):
    settings.REDLOCK = {"NODES": []}
    with pytest.raises(SystemCheckError, match=r"django_redlock\.E003"):
        call_command("check")


def test_every_check_id_is_unique_and_documented():
    source = (Path(__file__).parents[2] / "django_redlock" / "conf.py").read_text()
    used = set(re.findall(r"django_redlock\.[EW]\d{3}", source))
    page = (Path(__file__).parents[2] / "docs" / "reference" / "checks.md").read_text()
    documented = re.findall(r"^## `(django_redlock\.[EW]\d{3})`", page, flags=re.MULTILINE)
    assert len(documented) == len(set(documented)), "an id is documented twice"
    assert used <= set(documented), f"undocumented: {sorted(used - set(documented))}"
    table = (Path(__file__).parents[2] / "django_redlock" / "checks.py").read_text()
    rows = re.findall(r"^\| ([EW]\d{3}) \|", table, flags=re.MULTILINE)
    assert len(rows) == len(set(rows)), "an id is used for two problems"
    assert {f"django_redlock.{row}" for row in rows} == used


def test_a_bad_node_url_is_named_as_the_setting_names_it(settings):
    """E004 said ``nodes:`` (the LockManager argument) where every other message says
    ``REDLOCK['NODES']`` (issue 23)."""
    settings.REDLOCK = {"NODES": ["http://127.0.0.1:1"]}
    (message,) = [m for m in check_settings() if m.id == "django_redlock.E004"]
    assert message.msg.startswith("REDLOCK['NODES']: unsupported URL scheme 'http'")


def test_a_node_timeout_in_milliseconds_is_named_not_the_ttl(settings):
    # A new user wrote NODE_TIMEOUT 50 (meaning ms): the check blamed the TTL (E006, "too
    # short") and said nothing of the setting at fault.
    settings.REDLOCK = {"NODES": THREE, "TTL": 30.0, "NODE_TIMEOUT": 50}
    messages = check_settings()
    assert [message.id for message in messages] == ["django_redlock.E008"]
    (message,) = messages
    assert "REDLOCK['NODE_TIMEOUT'] (50 s)" in message.msg
    assert message.hint is not None
    assert "for 50 ms write 0.05" in message.hint
