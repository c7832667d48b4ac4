"""The node page's validation section: the latest validation's state, and the checks that failed
with their GPU and board serial."""

from tests.conftest import gpus


def test_the_node_page_shows_a_failed_validation_naming_the_check_gpu_and_serial(admin_ui, api):
    api.create_fleet("gpu-a", validation={})
    reported = [dict(g, serial=f"SN-{g['index']}") for g in gpus(2)]
    reg = api.register(api.create_join_token("gpu-a"), gpus=reported)
    session = reg["session_token"]
    validation = api.heartbeat(session)["validation"]
    page = admin_ui.text(f"/ui/nodes/{reg['node_id']}")
    assert (
        'id="node-validation"' in page
        and "running" in page
        and 'serial <span class="mono">SN-1</span>' in page
    )
    resp = api.post(
        f"/api/v1/agent/validations/{validation['id']}",
        {
            "checks": [
                {
                    "name": "row_remap",
                    "gpu": 1,
                    "status": "failed",
                    "detail": "remapped rows pending: GPU reset required",
                },
                {"name": "pcie_link", "gpu": 0, "status": "passed", "detail": "link max Gen5 x16"},
            ]
        },
        token=session,
        agent=True,
    )
    assert resp.status_code == 204
    page = admin_ui.text(f"/ui/nodes/{reg['node_id']}")
    section = page[page.index('id="validation-h"') : page.index('id="events-h"')]
    assert "failed_validation" in page and "remapped rows pending: GPU reset required" in section
    assert "SN-1" in section and "link max Gen5 x16" in section  # a failed run lists every check
