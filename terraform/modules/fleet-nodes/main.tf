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

  # What the destroy-time provisioner needs: it may refer to nothing but self.
  input = {
    remove = concat(var.fleetd_command, ["bootstrap", "--remove", "--url", var.fleetd_url,
    "--drain-deadline", var.drain_deadline, "--json"], var.force_remove ? ["--force"] : [], local.ssh_args)
    admin_token = var.admin_token
    results_dir = local.results_dir
  }

  lifecycle {
    precondition {
      condition     = var.server_url == null || length(var.server_urls) == 0
      error_message = "Set server_urls or the older server_url, not both."
    }
  }

  provisioner "local-exec" {
    interpreter = concat(local.bootstrap[each.key], ["--result-file", "${local.results_dir}/${self.id}.json"])
    command     = "${each.value.ssh_user}@${each.value.address}:${each.value.port}"
    # The token travels in the environment, never on a command line.
    environment = {
      FLEETD_TOKEN = var.admin_token
    }
  }

  provisioner "local-exec" {
    when        = destroy
    interpreter = self.input.remove
    command     = self.triggers_replace.host
    environment = {
      FLEETD_TOKEN = self.input.admin_token
    }
  }

  # Once the host is removed, its bootstrap result goes too (it runs only if the removal succeeded).
  provisioner "local-exec" {
    when        = destroy
    interpreter = ["rm", "-f", "--"]
    command     = "${self.input.results_dir}/${self.id}.json"
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
    interpreter = concat(local.bootstrap[each.key],
    ["--result-file", "${local.results_dir}/${terraform_data.this[each.key].id}.json"])
    command = "${each.value.ssh_user}@${each.value.address}:${each.value.port}"
    environment = {
      FLEETD_TOKEN = var.admin_token
    }
  }
}

locals {
  # Each host's bootstrap result (null before its first apply, or once its file is gone).
  results  = { for address, host in terraform_data.this : address => try(jsondecode(file("${local.results_dir}/${host.id}.json"))[0], null) }
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
data "terraform_remote_state" "fleet" {
  count   = var.check_drift ? 1 : 0
  backend = "http"
  config = {
    address  = "${trimsuffix(var.fleetd_url, "/")}/api/v1/fleets/${urlencode(var.fleet)}/terraform-state"
    username = "terraform"
    password = var.admin_token
  }
}

locals {
  # What fleetd says of each node ({} without the drift check: every node then reads as it was).
  fleet_nodes = try(data.terraform_remote_state.fleet[0].outputs.nodes, {})
}

# A failed assertion is a warning: the plan still runs, and says which hosts to look at.
check "fleet_nodes" {
  assert {
    condition = alltrue([
      for address, id in local.node_ids :
      !contains(local.gone, try(local.fleet_nodes[id].status, "absent")) if id != null && var.check_drift
    ])
    # Re-enrol such a host with `terraform apply -replace` on its terraform_data.this["<address>"].
    error_message = join("; ", [
      for address, id in local.node_ids :
      "host ${address}: node ${id} is ${try(local.fleet_nodes[id].status, "absent")}${try(" (${local.fleet_nodes[id].reason})", "")}"
      if id != null && var.check_drift && contains(local.gone, try(local.fleet_nodes[id].status, "absent"))
    ])
  }
}
