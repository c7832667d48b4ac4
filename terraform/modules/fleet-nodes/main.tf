locals {
  hosts       = { for h in var.hosts : h.address => h }
  results_dir = coalesce(var.results_dir, "${path.root}/.fleet-nodes")

  ssh_args = concat(
    ["--known-hosts", var.known_hosts_file],
    var.ssh_private_key_file == null ? [] : ["--key", var.ssh_private_key_file],
    var.jump_host == null ? [] : ["--jump", var.jump_host],
    var.use_sudo ? ["--sudo"] : [],
  )
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
    "--drain-deadline", var.drain_deadline, "--json"], local.ssh_args)
    admin_token = var.admin_token
  }

  provisioner "local-exec" {
    interpreter = concat(
      var.fleetd_command,
      ["bootstrap", "--fleet", var.fleet, "--url", var.fleetd_url, "--bundle", var.bundle,
        "--devices-backend", var.devices_backend, "--wait-timeout", var.wait_timeout,
        "--drain-deadline", var.drain_deadline, "--json",
      "--result-file", "${local.results_dir}/${self.id}.json"],
      var.server_url == null ? [] : ["--server-url", var.server_url],
      local.ssh_args,
      flatten([for k, v in each.value.labels : ["--label", "${k}=${v}"]]),
    )
    command = "${each.value.ssh_user}@${each.value.address}:${each.value.port}"
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
}
