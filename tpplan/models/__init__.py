"""tpplan.models"""
