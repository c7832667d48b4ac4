terraform {
  # terraform_data (built in) needs 1.4; optional object attributes need 1.3.
  required_version = ">= 1.4"
}
