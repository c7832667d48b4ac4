"""Names that people read (tokens', jobs', instances') cannot pass for other names: no bidi controls
or invisible characters, no compatibility look-alikes, no letters of two scripts; plain names,
accented and CJK ones among them, still work."""

import pytest

from fleetd.names import name_problem

SPOOFS = {
    "bidi override": "report\u202egnp.exe",
    "bidi isolate": "job\u2066x\u2069",
    "zero width space": "train\u200b",
    "hangul filler": "train\u3164",
    "variation selector": "train\ufe0f",
    "cyrillic a": "\u0430dmin",  # аdmin
    "greek omicron": "r\u03bfot-job",
    "full width": "\uff41\uff44\uff4d\uff49\uff4e",  # ａｄｍｉｎ
    "mathematical bold": "\U0001d41a\U0001d41d\U0001d426\U0001d422\U0001d427",
    "circled digit": "job-\u2460",
    "decomposed accent": "re\u0301sume\u0301",
    "bengali digit": "job-\u09ea",  # looks like 8
    "line separator": "a\u2028b",
    "no-break space": "a\u00a0b",
}
PLAIN = [
    "train-7b (v2)",
    "Jürgen's CI",
    "résumé",
    "日本語のテスト",
    "한국어 job",
    "Ελληνικά",
    "naïve_bayes #3",
]


@pytest.mark.parametrize("kind", ["job", "instance", "token"])
@pytest.mark.parametrize("spoof", sorted(SPOOFS))
def test_a_name_that_passes_for_another_is_refused_with_the_reason(api, kind, spoof):
    name = SPOOFS[spoof]
    if kind == "job":
        resp = api.post("/api/v1/jobs", {"name": name, "command": ["true"]})
    elif kind == "instance":
        resp = api.post("/api/v1/instances", {"name": name, "command": ["sleep", "1d"]})
    else:
        resp = api.post("/api/v1/tokens", {"name": name, "role": "submitter"})
    assert resp.status_code == 400, (spoof, resp.get_json())
    error = resp.get_json()["error"]
    assert error["code"] == "invalid_request" and error["details"]["fields"]["json"]["name"], error
    assert api.get("/api/v1/jobs").get_json()["items"] == []
    assert api.get("/api/v1/instances").get_json()["items"] == []
    assert [t["name"] for t in api.get("/api/v1/tokens").get_json()["items"]] == ["admin"]


def test_plain_names_in_any_one_script_still_name_jobs_instances_and_tokens(api):
    api.create_fleet()
    for i, name in enumerate(PLAIN):
        assert api.post("/api/v1/jobs", {"name": name, "command": ["true"]}).status_code == 201, (
            name
        )
        made = api.post("/api/v1/instances", {"name": name, "command": ["sleep", "1d"]})
        assert made.status_code == 201, (name, made.get_json())
        made = api.post("/api/v1/tokens", {"name": name, "role": "submitter"})
        assert made.status_code == 201, (name, made.get_json())
    assert {j["name"] for j in api.get("/api/v1/jobs").get_json()["items"]} == set(PLAIN)


def test_the_name_rule_says_which_character_or_script_is_wrong():
    assert "U+202E" in name_problem("x\u202ey") and "RIGHT-TO-LEFT OVERRIDE" in name_problem(
        "x\u202ey"
    )
    assert "Cyrillic, Latin" in name_problem("\u0430dmin")
    assert "'admin'" in name_problem("\uff41\uff44\uff4d\uff49\uff4e")
    assert (
        name_problem("データ々ー") is None
    )  # iteration and prolonged sound marks go with their script
