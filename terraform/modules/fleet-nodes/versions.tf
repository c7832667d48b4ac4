terraform {
  # check blocks with a scoped data source need 1.5; terraform_data (built in) 1.4.
  required_version = ">= 1.5"
}
