variable "hosts" {
  description = "GPU hosts to enrol: SSH address, SSH user and port, and node labels for each (a labels change reruns fleetd bootstrap on that host, never replaces its node)."
  type = list(object({
    address  = string
    ssh_user = optional(string, "root")
    port     = optional(number, 22)
    labels   = optional(map(string), {})
  }))

  validation {
    condition     = length(var.hosts) == length(distinct([for h in var.hosts : h.address]))
    error_message = "Each host address may appear only once."
  }
}

variable "fleetd_url" {
  description = "URL of fleetd's API, as seen from the machine running Terraform."
  type        = string
}

variable "server_urls" {
  description = "URLs the agents reach fleetd at, when they differ from fleetd_url: with replicas, each replica's URL; the agents try them in turn."
  type        = list(string)
  default     = []

  validation {
    condition     = length(var.server_urls) <= 16 && length(var.server_urls) == length(distinct(var.server_urls))
    error_message = "server_urls may list at most 16 URLs, each once."
  }

  validation {
    condition     = alltrue([for u in var.server_urls : can(regex("^(?i)https?://[^/]", u))])
    error_message = "Each of server_urls must start with http:// or https://."
  }
}

variable "server_url" {
  description = "Deprecated: one URL the agents reach fleetd at; use server_urls. Taken when server_urls is empty."
  type        = string
  default     = null
}

variable "admin_token" {
  description = "Admin API token of fleetd (mints one single-use join token per host, drains and deletes nodes). Given here, it is stored in the state for destroy: protect the state. null (the default): taken from the environment, FLEETD_TOKEN for the fleetd commands and TF_HTTP_PASSWORD for the drift check, and stored nowhere in the state."
  type        = string
  default     = null
  sensitive   = true
}

variable "fleet" {
  description = "Fleet the hosts join."
  type        = string
}

variable "bundle" {
  description = "Path of the offline bundle made by `fleetd bundle build`."
  type        = string
}

variable "ssh_private_key_file" {
  description = "SSH private key for the hosts; null uses ssh-agent and ~/.ssh/id_*."
  type        = string
  default     = null
}

variable "known_hosts_file" {
  description = "known_hosts file the host keys are checked against; hosts must be in it."
  type        = string
  default     = "~/.ssh/known_hosts"
}

variable "jump_host" {
  description = "Bastion to reach the hosts through, as [user@]host[:port]; null for none."
  type        = string
  default     = null
}

variable "use_sudo" {
  description = "Become root on the hosts with passwordless sudo."
  type        = bool
  default     = false
}

variable "devices_backend" {
  description = "Agent devices.backend: nvml, or fake:<path on the host> for demos and tests."
  type        = string
  default     = "nvml"
}

variable "wait_timeout" {
  description = "How long to wait for each node to become ready (e.g. 3m)."
  type        = string
  default     = "3m"
}

variable "drain_deadline" {
  description = "Drain deadline before a node is removed (e.g. 1h); running tasks are stopped after it."
  type        = string
  default     = "1h"
}

variable "force_remove" {
  description = "On destroy, a host that cannot be reached over SSH still has its node drained and deleted in fleetd (fleetd bootstrap --remove --force)."
  type        = bool
  default     = false
}

variable "check_drift" {
  description = "At plan time, read what fleetd says of each host's node, warn about nodes that are lost, revoked or gone, and plan a change for them (terraform_data.drift) so that plan -detailed-exitcode exits 2 (needs fleetd reachable when planning)."
  type        = bool
  default     = true
}

variable "fleetd_command" {
  description = "Command that runs the fleetd CLI on the machine running Terraform."
  type        = list(string)
  default     = ["fleetd"]
}

variable "results_dir" {
  description = "Directory for the per-host bootstrap results the outputs read; null: .fleet-nodes beside the root module."
  type        = string
  default     = null
}
