"""powerfleet.tasks"""
