"""powerfleet.retune"""
