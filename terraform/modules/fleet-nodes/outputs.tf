output "node_ids" {
  description = "fleetd node id of each host, by address."
  value = {
    for address, host in terraform_data.this :
    address => try(jsondecode(file("${local.results_dir}/${host.id}.json"))[0].node_id, null)
  }
}

output "nodes" {
  description = "Bootstrap result of each host, by address: node id, GPU count, result and reason."
  value = {
    for address, host in terraform_data.this :
    address => try(jsondecode(file("${local.results_dir}/${host.id}.json"))[0], null)
  }
}
