"""powerfleet.twin.gpus"""
