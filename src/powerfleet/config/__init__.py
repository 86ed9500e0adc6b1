"""powerfleet.config"""
