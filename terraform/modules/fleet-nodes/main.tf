locals {
  hosts       = { for h in var.hosts : h.address => h }
  results_dir = coalesce(var.results_dir, "${path.root}/.fleet-nodes")
  # server_urls, else the older single server_url, else none (the agents use fleetd_url).
  server_urls = length(var.server_urls) > 0 ? var.server_urls : compact([var.server_url == null ? "" : var.server_url])

  ssh_args = concat(
    ["--known-hosts", var.known_hosts_file],
    var.ssh_private_key_file == null ? [] : ["--key", var.ssh_private_key_file],
    var.jump_host == null ? [] : ["--jump", var.jump_host],
    var.use_sudo ? ["--sudo"] : [],
  )

  # The admin token for the fleetd commands, when it is given here; none: they take FLEETD_TOKEN from
  # Terraform's own environment, and the token is stored nowhere in the state.
  token_env = var.admin_token == null ? {} : { FLEETD_TOKEN = var.admin_token }

  # `fleetd bootstrap --remove` of a host (the host is the provisioner's command).
  remove = concat(var.fleetd_command, ["bootstrap", "--remove", "--url", var.fleetd_url,
  "--drain-deadline", var.drain_deadline, "--json"], var.force_remove ? ["--force"] : [], local.ssh_args)

  # `fleetd bootstrap` of each host, but for --result-file (each resource names its own file).
  bootstrap = { for address, h in local.hosts : address => concat(
    var.fleetd_command,
    ["bootstrap", "--fleet", var.fleet, "--url", var.fleetd_url, "--bundle", var.bundle,
      "--devices-backend", var.devices_backend, "--wait-timeout", var.wait_timeout,
    "--drain-deadline", var.drain_deadline, "--json"],
    flatten([for u in local.server_urls : ["--server-url", u]]),
    local.ssh_args,
    flatten([for k, v in h.labels : ["--label", "${k}=${v}"]]),
  ) }
}

# One resource per host. Creating it enrols the host with `fleetd bootstrap` (install, configure,
# enrol with a single-use join token, start, wait until ready); destroying it drains the node,
# stops and uninstalls the agent and deletes the node (`fleetd bootstrap --remove`).
resource "terraform_data" "this" {
  for_each = local.hosts

  # Another address, user, port, fleet or fleetd means another node.
  triggers_replace = {
    host       = "${each.value.ssh_user}@${each.value.address}:${each.value.port}"
    fleet      = var.fleet
    fleetd_url = var.fleetd_url
  }

  # What the destroy-time provisioner needs: it may refer to nothing but self. admin_token is null
  # when the token comes from the environment (then the state holds none).
  input = {
    remove      = local.remove
    admin_token = var.admin_token
    results_dir = local.results_dir
    result_file = "${local.results_dir}/${each.key}.json"
  }

  lifecycle {
    precondition {
      condition     = var.server_url == null || length(var.server_urls) == 0
      error_message = "Set server_urls or the older server_url, not both."
    }
  }

  # A result file this host's resource left behind: that resource was tainted (its bootstrap failed)
  # and Terraform runs no destroy-time provisioner for a tainted resource. Its replacement removes
  # the host first, as destroying it would have (drain, uninstall, delete its node), and its file.
  provisioner "local-exec" {
    interpreter = concat(["sh", "-c", "[ ! -e \"$0\" ] || { \"$@\" && rm -f -- \"$0\"; }",
    "${local.results_dir}/${each.key}.json"], local.remove)
    command     = "${each.value.ssh_user}@${each.value.address}:${each.value.port}"
    environment = local.token_env
  }

  provisioner "local-exec" {
    interpreter = concat(local.bootstrap[each.key], ["--result-file", "${local.results_dir}/${each.key}.json"])
    command     = "${each.value.ssh_user}@${each.value.address}:${each.value.port}"
    # The token travels in the environment, never on a command line.
    environment = local.token_env
  }

  provisioner "local-exec" {
    when        = destroy
    interpreter = self.input.remove
    command     = self.triggers_replace.host
    environment = self.input.admin_token == null ? {} : { FLEETD_TOKEN = self.input.admin_token }
  }

  # Once the host is removed, its bootstrap result goes too (it runs only if the removal succeeded;
  # the file named by the resource id is where older versions of this module kept it).
  provisioner "local-exec" {
    when        = destroy
    interpreter = ["rm", "-f", "--", "${self.input.results_dir}/${self.id}.json"]
    command     = try(self.input.result_file, "${self.input.results_dir}/${self.id}.json")
  }
}

# A host's labels live in its agent's config file. Changing them plans a replacement of this
# resource only (never of the node): it runs `fleetd bootstrap` on the host again, which rewrites
# the config and restarts the agent, whose next heartbeat gives fleetd the new labels. On the
# first apply it runs right after the enrolment and changes nothing.
resource "terraform_data" "labels" {
  for_each = local.hosts

  triggers_replace = {
    node   = terraform_data.this[each.key].id
    labels = jsonencode(each.value.labels)
  }

  provisioner "local-exec" {
    interpreter = concat(local.bootstrap[each.key], ["--result-file", "${local.results_dir}/${each.key}.json"])
    command     = "${each.value.ssh_user}@${each.value.address}:${each.value.port}"
    environment = local.token_env
  }
}

locals {
  # Each host's bootstrap result (null before its first apply, or once its file is gone; older
  # versions of this module named the file by the resource id).
  results = { for address, host in terraform_data.this : address => try(
    jsondecode(file("${local.results_dir}/${address}.json"))[0],
    jsondecode(file("${local.results_dir}/${host.id}.json"))[0],
    null
  ) }
  node_ids = { for address, result in local.results : address => try(result.node_id, null) }
  # Node statuses that mean the host no longer serves the fleet: its agent is gone (lost), its
  # credentials were revoked, or fleetd no longer has the node (absent).
  gone = ["lost", "revoked", "absent"]
}

# Drift, at plan time: what fleetd says of each host's node. Terraform reads it through its
# built-in http state backend, which fleetd answers with the fleet's nodes as a state output, so
# `terraform plan` needs no provider to download. The read is a top-level data source, read
# while planning: one scoped inside the check block would be planned as a read again at apply,
# which `terraform plan -detailed-exitcode` counts as a change (exit 2) even for a clean fleet.
# An apply that enrols or replaces hosts reads it once they are done (depends_on), so that the new
# nodes are in it.
data "terraform_remote_state" "fleet" {
  count      = var.check_drift ? 1 : 0
  depends_on = [terraform_data.this]
  backend    = "http"
  config = {
    address  = "${trimsuffix(var.fleetd_url, "/")}/api/v1/fleets/${urlencode(var.fleet)}/terraform-state"
    username = "terraform"
    # null: the http backend takes TF_HTTP_PASSWORD from the environment, and the state holds none.
    password = var.admin_token
  }
}

locals {
  # What fleetd says of each node ({} without the drift check: every node then reads as it was).
  fleet_nodes = try(data.terraform_remote_state.fleet[0].outputs.nodes, {})
  # One line per host whose node no longer serves the fleet.
  drifted = [
    for address, id in local.node_ids :
    "host ${address}: node ${id} is ${try(local.fleet_nodes[id].status, "absent")}${try(" (${local.fleet_nodes[id].reason})", "")}"
    if id != null && var.check_drift && contains(local.gone, try(local.fleet_nodes[id].status, "absent"))
  ]
}

# The warning that says which hosts to look at (a failed assertion is a warning: the plan runs on).
check "fleet_nodes" {
  assert {
    condition = length(local.drifted) == 0
    # Re-enrol such a host with `terraform apply -replace` on its terraform_data.this["<address>"].
    error_message = join("; ", local.drifted)
  }
}

# Drift as a planned change, so that `terraform plan -detailed-exitcode` exits 2 on a drifted fleet
# (a check's warning alone leaves it 0): while any host's node is gone, this marker is replaced at
# every plan (its trigger holds the time of the plan) and names the hosts; on a clean fleet its
# trigger stays as it is. Applying it does nothing.
resource "terraform_data" "drift" {
  triggers_replace = (
    length(local.drifted) > 0
    ? { hosts = local.drifted, planned_at = plantimestamp() }
    : { hosts = [], planned_at = "" }
  )
}
