"""tpplan.bench"""
