output "node_ids" {
  description = "fleetd node id of each host, by address."
  value       = local.node_ids
}

output "nodes" {
  description = "Bootstrap result of each host, by address: node id, GPU count, result and reason."
  value       = local.results
}
