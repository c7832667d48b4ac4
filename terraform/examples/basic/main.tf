# Enrol two GPU hosts into the fleet "training":
#   fleetd bundle build -o dist
#   export FLEETD_TOKEN=fla_...              # an admin token, kept out of files, command lines
#   export TF_HTTP_PASSWORD=$FLEETD_TOKEN    # and the state (the drift check reads fleetd with it)
#   terraform init && terraform apply
# `terraform destroy` drains the nodes, uninstalls the agent and deletes the nodes.
# `terraform plan -detailed-exitcode` exits 2 while a host's node is lost, revoked or deleted.

module "gpu_nodes" {
  source = "../../modules/fleet-nodes"

  fleetd_url = "https://fleetd.internal:8443"
  fleet      = "training"
  bundle     = "${path.root}/dist/fleet-agent-bundle-0.1.0.tar.gz"

  hosts = [
    { address = "10.0.0.11", ssh_user = "ops", labels = { rack = "r12" } },
    { address = "10.0.0.12", ssh_user = "ops", labels = { rack = "r12" } },
  ]
  ssh_private_key_file = "~/.ssh/fleet_ed25519"
  use_sudo             = true
}

output "node_ids" {
  description = "fleetd node id of each host."
  value       = module.gpu_nodes.node_ids
}
