"""powerfleet.metrics"""
